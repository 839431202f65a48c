// Must compile: the run stage including its own header and the implementations' (torch-free ones).
#include "verifier/impls/state_fault.hpp"
#include "verifier/run/state.hpp"
