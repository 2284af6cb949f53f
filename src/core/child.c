/* Helpers for reading untrusted files in a child process (core.h): the HDF5 readers run libhdf5
 * in forked children because it crashes on some damaged files. */
#include <signal.h>
#include <string.h>
#include <sys/wait.h>

#include "kiln/core.h"

void kiln_child_default_signals(void) {
  static const int fatal[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
  for (size_t i = 0; i < sizeof fatal / sizeof fatal[0]; i++) signal(fatal[i], SIG_DFL);
}

int kiln_child_failed(const char *path, const char *library, const char *reader, int status) {
  if (status != -1 && WIFSIGNALED(status) && WTERMSIG(status) != SIGPIPE)
    return kiln_errorf(KILN_ERR_PARSE, "%s: %s crashed reading it (signal %d, %s): the file is "
                       "damaged", path, library, WTERMSIG(status), strsignal(WTERMSIG(status)));
  return kiln_errorf(KILN_ERR_PARSE, "%s: %s ended without an answer (exit %d): the file is "
                     "damaged", path, reader,
                     status != -1 && WIFEXITED(status) ? WEXITSTATUS(status) : -1);
}
