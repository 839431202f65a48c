// Must not compile: the model layer reaching up into the run stage (layering_model_into_run).
#include "verifier/run/state.hpp"
