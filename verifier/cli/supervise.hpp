// verifier/cli/supervise.hpp: commands that run an implementation in one process of their own (`train`,
// `bench`, `audit-amp`) run their whole body in a forked child, supervised by ckverify's first process,
// as `check` runs Cases in workers (workers.hpp). The child is forked before LibTorch or Python start
// any thread, leads a process group of its own, and dies with its parent (PR_SET_PDEATHSIG). It tells
// the parent through a pipe when it starts loading code from outside ckverify (a plugin, a Python
// module), when the run stage starts a micro-batch (progress.hpp), and its exit code just before it
// leaves with _exit (static destructors do not run). The parent turns what happened into a verdict:
// Every message starts with a random token made before the fork (workers.hpp: channel_token), and the
// child's reported exit code counts only when the child then ends with it.
//   - the child reported its exit code and ended with it: that code;
//   - a line on the pipe that the child's ckverify did not write (the implementation, or a process it
//     forked, writing on a descriptor it does not own): the loaded implementation's finding (exit 1);
//   - it died of a signal, ended the process itself (exit(), os._exit()) before reporting, let an
//     exception that is not a std::exception escape, or made no progress for --stall-timeout seconds:
//     the loaded implementation's finding (exit 1, one line naming it and what happened) when code from
//     outside was loaded, ckverify's own bug (exit 3) when only ckverify's code ran; a stall of
//     ckverify's own code is exit 2 (a step slower than the timeout on this machine);
//   - SIGKILL that the parent did not send: killed from outside (the kernel's out-of-memory killer, a
//     memory limit, a user), exit 2, blaming no one; so is SIGTERM, SIGINT or SIGHUP sent to the child
//     itself (a user or a service manager stopping it);
//   - SIGINT, SIGTERM or SIGHUP to the parent: passed to the child's group, exit 128 + the signal.
// When the child is gone its whole process group is killed, and with it what the implementation forked
// out of the group (containment.hpp), so processes the implementation forked never outlive the command.
// The child's standard output and error are pipes the parent relays to its own, bounded (containment.hpp):
// a process the child forked holds those, never the command's stdout or stderr.
#pragma once

#include <functional>
#include <string>

namespace ckv::cli {

struct SuperviseOptions {
  std::string command;           // "train", for messages
  double stall_timeout_s = 300;  // longest time without progress before the run counts as hung
};

int supervise(const SuperviseOptions& options, const std::function<int()>& body);

// Whether the command's stderr is a terminal (in the supervised child, whose stderr is a pipe: whether
// the parent's is).
bool stderr_is_terminal();

}  // namespace ckv::cli
