#pragma once
// The CPU runtime under the ops: OpenMP's wait policy and the BLAS's kernel choice. Both
// libraries read their settings from the environment when they load, before main, so a
// program that wants them changed sets the environment and starts itself again, once.
#include <string>

namespace cast::ops {

// Call first thing in main. Sets, where the user has not:
//  * the OpenMP wait policy, from a look at the machine as the program starts:
//    - the cores the threads need free (no other process running on them): OMP_WAIT_POLICY
//      active with GOMP_SPINCOUNT=kSpinCount, so a thread spins about 0.1 ms at a barrier
//      before it sleeps: a small model's step is hundreds of short parallel regions, and
//      waking a sleeping thread for each cost a third of its time;
//    - another process running: passive, threads sleep at barriers at once, so that process
//      no longer makes every step wait for a descheduled spinner;
//  * OPENBLAS_CORETYPE to this CPU's vector ISA when OpenBLAS's own detection picked an older
//    one (it does on virtual machines that report a generic CPU model: "Prescott" kernels
//    run sgemm at a quarter of the speed of the AVX-512 ones).
// If anything changed it re-executes the program (execv of /proc/self/exe); on failure it
// returns and the program runs with the libraries' defaults.
void restart_with_cpu_runtime(char** argv);
// The restarted process's first call: its standard error back from /dev/null, where the restart
// kept the OpenMP runtime's load-time warnings from printing a second time.
void restore_stderr_after_restart();
inline constexpr const char* kSpinCount = "10000";

std::string blas_core();           // the OpenBLAS kernel set in use, e.g. "Cooperlake"
// Where OPENBLAS_CORETYPE names a kernel set OpenBLAS did not take (a name it does not know,
// which it ignores without a word): what runs instead, for one line; "" otherwise.
std::string blas_core_refusal();
std::string openmp_wait_policy();  // OMP_WAIT_POLICY as set, or "default", and GOMP_SPINCOUNT if set

}  // namespace cast::ops
