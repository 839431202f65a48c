// verifier/tests/dist_rank_main.cpp: the program dist_rank (dist_rank.hpp).
#include "verifier/tests/dist_rank.hpp"

int main(int argc, char** argv) {
  return dist_rank_main(argc, argv);
}
