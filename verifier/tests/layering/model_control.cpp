// Must compile: the model layer including a layer below it, with the same flags as the probes above.
#include "verifier/case/case.hpp"
#include "verifier/case/environment_error.hpp"
