#pragma once
// Another process holding a folder (files::FolderLock), as a second cast process would: a child
// that takes the folder's lock and waits until the holder object goes.
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <stdexcept>
#include <string>

#include "tensor/files.h"

namespace cast::testing {

class FolderHeldElsewhere {
 public:
  FolderHeldElsewhere(const std::string& folder, const std::string& what) {
    int ready[2];
    if (::pipe(ready) != 0) throw std::runtime_error("pipe failed");
    pid_ = ::fork();
    if (pid_ == 0) {
      try {
        const files::FolderLock lock(folder, what);
        (void)!::write(ready[1], "x", 1);
        ::pause();
      } catch (...) {
      }
      ::_exit(0);
    }
    char byte = 0;
    const bool held = ::read(ready[0], &byte, 1) == 1;  // the lock is taken (else the child ended)
    ::close(ready[0]);
    ::close(ready[1]);
    if (!held) throw std::runtime_error("the holder could not take the lock of " + folder);
  }
  ~FolderHeldElsewhere() {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  FolderHeldElsewhere(const FolderHeldElsewhere&) = delete;
  FolderHeldElsewhere& operator=(const FolderHeldElsewhere&) = delete;
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
};

}  // namespace cast::testing
