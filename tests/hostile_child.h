#pragma once
// Runs a load of a hostile file in a forked child under an address-space limit and a timeout,
// so that a crash, a hang or an unbounded allocation fails the test instead of the test binary.
// The child reports what it caught through a pipe; the parent asserts it exited normally.
//
// fork() copies only the calling thread: a test binary using these helpers must not start wick's
// thread pool (or other threads) in the parent, or a child could wait on threads it does not have.
// So every wick call of such a test runs inside run_bounded.

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <new>
#include <string>
#include <typeinfo>

#include "wick/error.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define WICK_TEST_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define WICK_TEST_SANITIZED 1
#endif
#endif
#ifndef WICK_TEST_SANITIZED
#define WICK_TEST_SANITIZED 0
#endif

namespace wick::testing {

/// Limits of one child run.
struct ChildLimits {
  /// Address space the child may add to what the test process already maps (not applied under
  /// AddressSanitizer or ThreadSanitizer, whose shadow memory needs terabytes of it).
  size_t extra_address_space = size_t{1} << 30;
  /// Wall-clock seconds before the child is killed (SIGALRM).
  unsigned seconds = 30;
};

/// How a child run ended: `report` is what the child wrote; `signal` is non-zero when it was
/// killed (SIGALRM: over its time; SIGSEGV, SIGFPE, SIGABRT: a crash).
struct ChildResult {
  bool exited = false;
  int status = -1;
  int signal = 0;
  std::string report;
};

/// The bytes of virtual memory this process maps now.
inline size_t mapped_bytes() {
  std::ifstream statm("/proc/self/statm");
  size_t pages = 0;
  statm >> pages;
  return pages * static_cast<size_t>(::sysconf(_SC_PAGESIZE));
}

/// Runs `body` in a child; its return value comes back as the report. Exit status 0: `body`
/// returned; 1: it threw (the report names the exception).
inline ChildResult run_bounded(const std::function<std::string()>& body,
                               const ChildLimits& limits = {}) {
  int fds[2];
  if (::pipe(fds) != 0) return {false, -1, 0, "pipe failed"};
  std::fflush(nullptr);
  pid_t pid = ::fork();
  if (pid < 0) return {false, -1, 0, "fork failed"};
  if (pid == 0) {
    ::close(fds[0]);
    if (!WICK_TEST_SANITIZED) {
      rlim_t cap = mapped_bytes() + limits.extra_address_space;
      struct rlimit rl {
        cap, cap
      };
      ::setrlimit(RLIMIT_AS, &rl);
    }
    ::alarm(limits.seconds);
    std::string report;
    int code = 0;
    try {
      report = body();
    } catch (const std::exception& e) {
      report = std::string(typeid(e).name()) + ": " + e.what();
      code = 1;
    } catch (...) {
      report = "a non-std exception";
      code = 1;
    }
    const char* p = report.data();
    size_t left = report.size();
    while (left > 0) {
      ssize_t n = ::write(fds[1], p, left);
      if (n <= 0) break;
      p += n;
      left -= static_cast<size_t>(n);
    }
    ::close(fds[1]);
    ::_exit(code);
  }
  ::close(fds[1]);
  ChildResult r;
  char buf[4096];
  while (true) {
    ssize_t n = ::read(fds[0], buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    r.report.append(buf, static_cast<size_t>(n));
  }
  ::close(fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status)) {
    r.exited = true;
    r.status = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    r.signal = WTERMSIG(status);
  }
  return r;
}

/// Runs `load` in a bounded child and asserts that it threw an `E` (not std::bad_alloc or another
/// exception) whose message contains each of `needles` and is at most `max_message` bytes long.
template <class E>
::testing::AssertionResult throws_bounded(const std::function<void()>& load,
                                          const std::vector<std::string>& needles,
                                          const ChildLimits& limits = {},
                                          size_t max_message = 2000) {
  ChildResult r = run_bounded(
      [&]() -> std::string {
        try {
          load();
        } catch (const E& e) {
          return std::string("CAUGHT ") + e.what();
        } catch (const std::bad_alloc&) {
          return "bad_alloc (over the memory limit)";
        } catch (const std::exception& e) {
          return std::string("WRONG TYPE ") + typeid(e).name() + ": " + e.what();
        }
        return "NOTHING THROWN";
      },
      limits);
  if (!r.exited) {
    return ::testing::AssertionFailure()
           << "child killed by signal " << r.signal << " (" << strsignal(r.signal)
           << (r.signal == SIGALRM ? ": over the time limit" : "") << ")";
  }
  if (r.report.rfind("CAUGHT ", 0) != 0) return ::testing::AssertionFailure() << r.report;
  std::string msg = r.report.substr(7);
  for (const auto& needle : needles) {
    if (msg.find(needle) == std::string::npos) {
      return ::testing::AssertionFailure() << "message lacks \"" << needle << "\": " << msg;
    }
  }
  if (msg.size() > max_message) {
    return ::testing::AssertionFailure()
           << "message of " << msg.size() << " bytes: " << msg.substr(0, 200) << "...";
  }
  return ::testing::AssertionSuccess() << msg;
}

/// Runs `body` in a bounded child and asserts that it returned normally (a check inside `body`
/// throws to fail: gtest assertions made in the child are not seen by the parent).
inline ::testing::AssertionResult completes_bounded(const std::function<void()>& body,
                                                    const ChildLimits& limits = {}) {
  ChildResult r = run_bounded(
      [&]() -> std::string {
        body();
        return "OK";
      },
      limits);
  if (!r.exited) {
    return ::testing::AssertionFailure()
           << "child killed by signal " << r.signal << " (" << strsignal(r.signal)
           << (r.signal == SIGALRM ? ": over the time limit" : "") << ")";
  }
  if (r.status != 0 || r.report != "OK") return ::testing::AssertionFailure() << r.report;
  return ::testing::AssertionSuccess();
}

}  // namespace wick::testing
