// SIGTERM and SIGUSR1 asking a running fit to stop: the preemption notice of a cluster manager
// (SLURM's --signal, Kubernetes, torchrun passing on its own SIGTERM). While a StopSignals is
// alive they no longer kill the process; the Trainer polls received() at every optimizer step,
// agrees with the other ranks to stop after that step, saves last.ckpt and reports the signal.
#pragma once

namespace pipetrain {

class StopSignals {
 public:
  StopSignals();   // installs the handlers, remembering the previous ones
  ~StopSignals();  // puts the previous ones back
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  // The first stop signal received since construction (SIGTERM or SIGUSR1), 0 if none.
  static int received();
};

}  // namespace pipetrain
