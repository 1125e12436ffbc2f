#include "stop_signals.h"

#include <signal.h>

#include <csignal>
#include <iterator>

namespace pipetrain {
namespace {

// All a handler may touch.
volatile std::sig_atomic_t g_received = 0;

void on_stop_signal(int signo) {
  if (g_received == 0) g_received = signo;
}

constexpr int kStopSignals[] = {SIGTERM, SIGUSR1};
struct sigaction g_previous[std::size(kStopSignals)];

}  // namespace

StopSignals::StopSignals() {
  g_received = 0;
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // the step's own system calls go on as if nothing happened
  for (size_t i = 0; i < std::size(kStopSignals); ++i) {
    sigaction(kStopSignals[i], &action, &g_previous[i]);
  }
}

StopSignals::~StopSignals() {
  for (size_t i = 0; i < std::size(kStopSignals); ++i) {
    sigaction(kStopSignals[i], &g_previous[i], nullptr);
  }
}

int StopSignals::received() { return g_received; }

}  // namespace pipetrain
