// A small MPI program for the job tests: ranks all-reduce in a loop, and
// rank 1 fails at round 5 in the way the argument names:
//   throw    an exception in its device program
//   exit     exits the process (status 3) without finalising MPI
//   skip     skips a collective, so the others wait (the watchdog ends it)
//   none     no failure; prints "ok" on rank 0
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "shardflow/runtime/runtime.h"

namespace sf = shardflow;

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "none";
  sf::Runtime rt = sf::Runtime::mpi();
  sf::DeviceGroup everyone;
  for (int64_t d = 0; d < rt.num_devices(); ++d) everyone.devices.push_back(d);
  for (int round = 0; round < 10; ++round) {
    rt.run([&](int64_t device, sf::Communicator& comm) {
      if (device == 1 && round == 5) {
        if (mode == "throw") throw std::runtime_error("injected failure at round 5");
        if (mode == "exit") std::exit(3);
        if (mode == "skip") return;
      }
      std::vector<float> data(1024, 1.0f);
      comm.all_reduce(everyone, std::as_writable_bytes(std::span(data)), sf::DType::kF32, sf::ReduceOp::kSum);
    });
  }
  if (rt.process_index() == 0) std::printf("ok\n");
  return 0;
}
