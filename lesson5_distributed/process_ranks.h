// Ranks as PROCESSES of this binary, torchrun-style: shared by lesson 5's demo (demo_ranks.h, also //bench) and
// lesson 7's demo. Header only, so every binary compiles it against the communicator it links.
//
// The parent opens a TCPStore server (127.0.0.1, or rank 0's address on a simulated network) at a port the system
// picks and starts every rank as fork + exec of /proc/self/exe with flags --<prefix>_rank=, _world=, _port=
// (and _store=, _host= on a network), besides the demo's own; every rank connects to the store, joins one Gloo
// group, runs the demo's body, and rank 0 sends the body's text back through the store under "<prefix>/results".
// The parent waits with a deadline and kills (by pid) any rank that outlives it; a failed rank is an error.
//
// On a (simulated) real network, `Network` names one Linux network namespace and one address per rank (made by
// lesson5_distributed/netns/netns_run.sh): the parent, started inside rank 0's namespace, opens the store on rank
// 0's address, starts rank r inside namespace r (fork, setns, exec), and every rank binds Gloo to its own
// address, so the bytes cross the namespaces' veth links (bandwidth shaped by the kernel) as between hosts.
#pragma once

#include <fcntl.h>
#include <sched.h>

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iomanip>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <c10/util/Exception.h>

#include "lesson5_distributed/comm.h"

extern char** environ;

namespace ranks {

/// Where the ranks run. Empty: every rank on 127.0.0.1 in this network namespace (the default).
struct Network {
  std::vector<std::string> netns;  ///< rank r starts inside the namespace /run/netns/<netns[r]> (empty: here)
  std::vector<std::string> hosts;  ///< rank r's Gloo address; the store listens in the parent at hosts[0]
};

/// "a,b,,c" -> {"a", "b", "c"}.
inline std::vector<std::string> split_commas(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

/// The demos' --netns and --hosts (comma-separated, one per rank; netns_run.sh passes them): one network namespace
/// and one address per rank, or loopback. Namespaces that cannot be used (not root, a missing one) fall back to
/// loopback, saying so on stdout: the ranks can still run.
inline Network network_from(const std::string& netns, const std::string& hosts, int world_size) {
  // [demo_network]
  Network network;
  network.netns = split_commas(netns);
  network.hosts = split_commas(hosts);
  TORCH_CHECK(network.netns.empty() || !network.hosts.empty(), "--netns needs --hosts (one address per rank)");
  if (!network.netns.empty()) {
    TORCH_CHECK(static_cast<int>(network.netns.size()) == world_size, "--netns names ", network.netns.size(),
                " namespaces for --world_size=", world_size, " (one per rank)");
    std::string why;
    if (geteuid() != 0) why = "not root";
    for (const auto& ns : network.netns) {
      if (why.empty() && access(("/run/netns/" + ns).c_str(), R_OK) != 0) why = "no namespace /run/netns/" + ns;
    }
    if (!why.empty()) {  // the ranks can still run: on loopback, saying so
      std::cout << "note: network namespaces unavailable (" << why << "): falling back to loopback\n";
      network = {};
    }
  }
  if (!network.hosts.empty()) {
    TORCH_CHECK(static_cast<int>(network.hosts.size()) == world_size, "--hosts names ", network.hosts.size(),
                " addresses for --world_size=", world_size, " (one per rank)");
  }
  // [demo_network]
  return network;
}

/// The link as the demos' flags describe it (netns_run.sh passes them): a kernel-shaped rate (0: not shaped), a
/// delay simulated per collective by dist::Comm, a delay the kernel adds per packet (netem).
struct LinkFlags {
  double gbit = 0;           ///< --link_gbit
  double delay_ms = 0;       ///< --sim_delay_ms
  double link_delay_ms = 0;  ///< --link_delay_ms
};

/// LinkFlags from the flags' values, checked (each out of range is an error that names its flag).
inline LinkFlags link_flags(double link_gbit, double sim_delay_ms, double link_delay_ms) {
  TORCH_CHECK(sim_delay_ms >= 0 && sim_delay_ms <= 100, "--sim_delay_ms must be in 0 .. 100, got ", sim_delay_ms);
  TORCH_CHECK(link_delay_ms >= 0, "--link_delay_ms must be >= 0, got ", link_delay_ms);
  TORCH_CHECK(link_gbit >= 0, "--link_gbit must be >= 0, got ", link_gbit);
  return LinkFlags{link_gbit, sim_delay_ms, link_delay_ms};
}

/// The demos' "Link: ..." line (without its newline): how the link was made (`link`, netns_run.sh's --link), its
/// kernel-shaped rate (0: not shaped, the napkin then uses `unshaped`, what the demo measured), the latency
/// simulated per collective and the kernel's per packet (netem).
inline std::string link_line(const std::string& link, double link_gbit, double delay_ms, double link_delay_ms,
                             const std::string& unshaped) {
  auto fixed = [](double value, int digits) {
    std::ostringstream out;
    out << std::fixed << std::setprecision(digits) << value;
    return out.str();
  };
  return "Link: " + link + "; bandwidth " +
         (link_gbit > 0 ? fixed(link_gbit, 2) + " Gbit/s per rank (kernel-shaped, as given)"
                        : "not shaped (napkin: " + unshaped + ")") +
         "; latency " + fixed(delay_ms, 3) + " ms per collective " +
         (delay_ms > 0 ? "SIMULATED by dist::Comm (not by the kernel)" : "simulated: none") +
         (link_delay_ms > 0 ? " + " + fixed(link_delay_ms, 3) + " ms per packet by the kernel (netem)" : "");
}

/// One launch of `world_size` ranks.
struct Launch {
  std::string prefix;  ///< "l5": flags --l5_rank=..., store keys l5/results and l5/done
  std::string who;     ///< names the launcher in its errors, e.g. "lesson 5 demo"
  int world_size = 1;
  std::vector<std::string> args;  ///< the demo's own flags, given to every rank
  int exit_rank = -1;  ///< >= 0: that rank exits right after joining (a fault drill: the others must fail fast)
  const Network* network = nullptr;  ///< nullptr: loopback
  std::chrono::seconds deadline{600};
};

/// In a child started by launch(): joins the group, runs `body` (the demo's measurements; its text is rank 0's
/// results) and returns the exit code. -1 when argv is not a child's of launches with `prefix`. `body` gets
/// every argument, to read the demo's own flags from.
inline int run_as_rank(const std::string& prefix, int argc, char** argv,
                       const std::function<std::string(dist::Comm&, const std::vector<std::string>&)>& body) {
  int rank = -1, port = -1, world_size = 1;
  bool exit_after_join = false;
  std::string store_host = "127.0.0.1", gloo_host = "127.0.0.1";
  const std::string p = "--" + prefix + "_";
  std::vector<std::string> args;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    args.push_back(a);
    auto is = [&](const char* name) { return a.rfind(p + name + "=", 0) == 0; };
    auto value = [&](const char* name) { return a.substr(p.size() + std::strlen(name) + 1); };
    if (is("rank")) rank = std::stoi(value("rank"));
    if (is("port")) port = std::stoi(value("port"));
    if (is("world")) world_size = std::stoi(value("world"));
    if (is("store")) store_host = value("store");
    if (is("host")) gloo_host = value("host");
    if (a == p + "exit_after_join") exit_after_join = true;
  }
  if (rank < 0) return -1;
  try {
    dist::TcpRendezvous store(store_host, port, /*is_server=*/false, std::chrono::seconds(120));
    std::unique_ptr<dist::Comm> comm = store.join(rank, world_size, "gloo", gloo_host);
    if (exit_after_join) std::_Exit(0);  // the fault drill: leave without a word, sockets closed by the kernel
    const std::string text = body(*comm, args);
    comm->set_simulated_delay(std::chrono::microseconds(0));
    comm->barrier();
    if (rank == 0) store.set(prefix + "/results", text);
    store.get(prefix + "/done");  // the parent says when it has read the results: keep the store's clients alive
    return 0;
  } catch (const c10::Error& error) {
    const std::string message = error.what_without_backtrace();
    std::cerr << (message.rfind("rank ", 0) == 0 ? "" : "rank " + std::to_string(rank) + ": ") << message << "\n";
    return 1;
  } catch (const std::exception& error) {
    std::cerr << "rank " << rank << ": " << error.what() << "\n";
    return 1;
  }
}

/// Starts `l.world_size` ranks as processes of this binary, waits (at most `l.deadline`), and returns rank 0's
/// text. Any rank still running at the deadline is killed; a failed rank is an error ("<who>: rank r failed").
inline std::string launch(const Launch& l) {
  const size_t n = static_cast<size_t>(l.world_size);
  const Network* network = l.network;
  const bool in_netns = network != nullptr && !network->netns.empty();
  if (network != nullptr) {
    TORCH_CHECK(network->hosts.size() == n, l.who, ": ", network->hosts.size(), " addresses for ", n,
                " ranks (one per rank)");
    TORCH_CHECK(network->netns.empty() || network->netns.size() == n, l.who, ": ", network->netns.size(),
                " network namespaces for ", n, " ranks (one per rank, or none)");
  }
  const std::string store_host = network != nullptr ? network->hosts[0] : "127.0.0.1";
  // Open every namespace before starting anyone: a missing one is a clear error, not a rank that never comes.
  std::vector<int> netns_fds;
  for (size_t r = 0; in_netns && r < n; ++r) {
    const std::string path = "/run/netns/" + network->netns[r];
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      const std::string why = std::strerror(errno);
      for (int other : netns_fds) close(other);
      TORCH_CHECK(false, l.who, ": cannot open the network namespace ", path, " for rank ", r, ": ", why);
    }
    netns_fds.push_back(fd);
  }
  dist::TcpRendezvous store(store_host, 0, /*is_server=*/true, l.deadline);
  const int port = store.port();
  const std::string p = "--" + l.prefix + "_";
  std::vector<pid_t> pids;
  for (int rank = 0; rank < l.world_size; ++rank) {
    std::vector<std::string> args = {"/proc/self/exe", p + "rank=" + std::to_string(rank),
                                     p + "world=" + std::to_string(l.world_size), p + "port=" + std::to_string(port)};
    args.insert(args.end(), l.args.begin(), l.args.end());
    if (network != nullptr) {
      args.push_back(p + "store=" + store_host);
      args.push_back(p + "host=" + network->hosts[static_cast<size_t>(rank)]);
    }
    if (rank == l.exit_rank) args.push_back(p + "exit_after_join");
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(&a[0]);
    argv.push_back(nullptr);
    pid_t pid = 0;
    if (in_netns) {
      // fork, enter rank r's namespace, exec: only system calls between fork and exec (the parent has threads).
      const int fd = netns_fds[static_cast<size_t>(rank)];
      pid = fork();
      if (pid == 0) {
        if (setns(fd, CLONE_NEWNET) != 0) _exit(126);
        execv("/proc/self/exe", argv.data());
        _exit(127);
      }
      TORCH_CHECK(pid > 0, "could not start rank ", rank, ": ", std::strerror(errno));
    } else {
      const int error = posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv.data(), environ);
      TORCH_CHECK(error == 0, "could not start rank ", rank, ": ", std::strerror(error));
    }
    pids.push_back(pid);
  }
  for (int fd : netns_fds) close(fd);
  // Wait for rank 0's results while watching the ranks: a rank that fails ends the wait at once.
  const std::string results_key = l.prefix + "/results";
  std::string failure;
  std::vector<bool> exited(pids.size(), false);
  const auto give_up = std::chrono::steady_clock::now() + l.deadline;
  while (!store.has(results_key) && failure.empty()) {
    for (size_t r = 0; r < pids.size(); ++r) {
      int status = 0;
      if (!exited[r] && waitpid(pids[r], &status, WNOHANG) == pids[r]) {
        exited[r] = true;
        if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0))
          failure = "rank " + std::to_string(r) + " failed (see above)";
        if (WIFEXITED(status) && WEXITSTATUS(status) == 126)
          failure = "rank " + std::to_string(r) + " could not enter its network namespace";
      }
    }
    if (std::chrono::steady_clock::now() > give_up) failure = "no results from rank 0 within the deadline";
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const std::string text = failure.empty() ? store.get(results_key) : "";
  store.set(l.prefix + "/done", "1");
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(failure.empty() ? 30 : 1);
  for (size_t r = 0; r < pids.size(); ++r) {
    if (exited[r]) continue;
    int status = 0;
    while (waitpid(pids[r], &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > until) {
        kill(pids[r], SIGKILL);  // only the ranks this function started, by pid
        waitpid(pids[r], &status, 0);
        if (failure.empty()) failure = "rank " + std::to_string(r) + " did not exit and was killed";
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (failure.empty() && !(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
      failure = "rank " + std::to_string(r) + " failed (see above)";
    }
  }
  TORCH_CHECK(failure.empty(), l.who, ": ", failure);
  return text;
}

}  // namespace ranks
