// The bench's cases, one file per lesson (bench/lesson1.cc ... bench/lesson6.cc, bench/scaler.cc), each its own
// library with only that lesson's dependencies; bench/main.cc lists them in its table.
#pragma once

#include "bench/harness.h"

namespace bench {

void lesson1(Context& c);        ///< float32 vs TF32 vs autocast, beside torch.autocast
void lesson2(Context& c);        ///< accumulation: memory and time vs K, beside the same loop in Python
void lesson3(Context& c);        ///< the planted loop before and after the fix (no PyTorch peer)
void lesson4(Context& c);        ///< peak bytes and time per memory recipe, beside checkpoint_sequential
void scaler(Context& c);         ///< the GradScaler's own cost, beside PyTorch's
void scaler_finish(Context& c);  ///< after the rounds: PyTorch's scaler row from the peer's summary
void lesson5(Context& c);        ///< data parallel on N rank processes, beside DistributedDataParallel / ZeRO
/// Lesson 5's ranks are processes of the bench binary: their exit code when argv is a rank's, else -1.
int lesson5_rank(int argc, char** argv);
void lesson6(Context& c);  ///< one AdamW step: torch::optim::AdamW, unfused ops, the fused operator, beside torch.optim

}  // namespace bench
