// Must not compile: an implementation reaching up into the run stage (layering_impls_into_run).
#include "verifier/run/run.hpp"
