// verifier/tests/dist_rank.hpp: the rank program of dist_tests (dist_rank.cpp), callable: the program
// dist_rank's main, and what dist_tests' rank fork servers run in the ranks they fork.
#pragma once

int dist_rank_main(int argc, char** argv);
