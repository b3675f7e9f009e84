// The bench's side of the PyTorch comparison: runs bench/peer.py (PyTorch's own implementations of what the
// lessons build) as a subprocess with our sizes, seed, thread count and device, and reads back its rows; and
// measures our peak bytes the way the peer measures its own, so that the two columns compare like with like.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include <c10/core/Device.h>

namespace bench {

/// One result of the peer, keyed like the C++ row it mirrors ("l1.bf16", "l2.k4", "scaler.pytorch", ...).
struct PeerRow {
  double median_ms = 0, min_ms = 0, max_ms = 0;
  int64_t peak_bytes = -1;  ///< -1: not measured
  std::string what;         ///< the PyTorch API it used, e.g. "torch.autocast('cpu', bfloat16)"
  std::string unavailable;  ///< non-empty: PyTorch has no equivalent here, and why ("not available in 1.13 on CPU")
  int rounds = 1;           ///< how many runs of the case it summarises (median of their medians)
};

/// How the peer is run.
struct PeerOptions {
  bool enabled = true;
  std::string python;  ///< the interpreter (see default_peer_python)
  std::string script;  ///< bench/peer.py (see find_peer_script)
  c10::Device device{c10::kCPU};
  int threads = 1;  ///< torch.set_num_threads in the peer: ours, at::get_num_threads()
};

/// --peer_python if given, else $WORKSHOP_PEER_PYTHON, else /usr/bin/python3 (Debian's python3-torch; a `python3`
/// on PATH may be another Python without torch, so PATH is not searched).
std::string default_peer_python(const std::string& flag);

/// bench/peer.py: `flag` if given, else in the runfiles of `argv0` (bazel run / bazel test), else ./bench/peer.py.
std::string find_peer_script(const char* argv0, const std::string& flag);

class Peer {
 public:
  explicit Peer(PeerOptions options);

  /// Runs `peer.py --case=NAME --spec=SPEC` and stores its rows. Does nothing once the peer is known to be
  /// missing (no torch for that interpreter, no interpreter, no script) or off. Run again (a later round), a
  /// key's row becomes the median of the rounds' medians, with the smallest minimum and the largest maximum.
  void run(const std::string& case_name, const std::string& spec);

  /// The peer's row for `key`, or nullptr.
  const PeerRow* find(const std::string& key) const;

  bool enabled() const { return options_.enabled; }
  /// True once a run succeeded.
  bool available() const { return !torch_version_.empty(); }
  /// Why the peer did not run ("" when it did or was not tried yet).
  const std::string& missing() const { return missing_; }
  /// Non-empty when a run failed for another reason than a missing torch (a bug: the bench exits non-zero).
  const std::string& failure() const { return failure_; }
  const std::string& torch_version() const { return torch_version_; }
  /// What the peer reported about itself: interpreter and version, threads, how peaks are measured.
  const std::map<std::string, std::string>& info() const { return info_; }
  const PeerOptions& options() const { return options_; }

 private:
  PeerOptions options_;
  std::map<std::string, std::vector<PeerRow>> history_;  // every round's row per key
  std::map<std::string, PeerRow> rows_;                  // their summary
  std::map<std::string, std::string> info_;
  std::string torch_version_, missing_, failure_;
};

/// Peak bytes of one run of `work`, measured as bench/peer.py measures PyTorch's: on CUDA from the caching
/// allocator's statistics; on CPU from the legacy profiler's allocation events (the highest running sum of
/// allocations minus frees during the second of two runs, so that every block the step frees was allocated
/// under the profiler). Runs `work` twice on CPU, once on CUDA. `between`, if given, runs after the first run
/// (before the measured one; on CUDA before the one run): e.g. setting gradients to none, so that the measured
/// step starts from the state a meter-measured step starts from.
int64_t same_way_peak_bytes(c10::Device device, const std::function<void()>& work,
                            const std::function<void()>& between = nullptr);

/// How same_way_peak_bytes measures on `device`, in words for the tables.
std::string same_way_peak_method(c10::Device device);

}  // namespace bench
