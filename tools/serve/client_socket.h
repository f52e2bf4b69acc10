#pragma once
// The socket of the connection a request came on, and whether its client has gone away.
// cpp-httplib 0.11 (Debian's) gives a handler neither the socket nor `is_connection_closed`
// (later versions add it), so a handler that waits long (a non-streamed completion) could not
// tell that its client left. The handler runs on the worker thread that owns the connection and
// httplib closes the socket only after the handler returns, so the descriptor found here stays
// valid for the whole handler.

#include <httplib.h>

#include <chrono>

namespace wick::serve_http {

/// The descriptor of this process's socket whose local and peer address and port are the
/// request's (`local_addr:local_port`, `remote_addr:remote_port`, formatted as httplib does:
/// getnameinfo with NI_NUMERICHOST); -1 when none is found. Scans /proc/self/fd.
int connection_socket(const httplib::Request& req);

/// Whether the peer of the connected socket `fd` has closed it (an orderly close, a reset or an
/// error). Never blocks. Bytes waiting to be read (a pipelined request) do not count as a close;
/// false for fd < 0.
bool peer_closed(int fd);

/// Watches a request's client from its handler: gone() turns true once the peer has closed the
/// connection. The socket is looked for at the first check, which comes only after `period` (a
/// short request pays nothing); later checks come at most once per `period`. When no socket is
/// found, gone() stays false.
class ClientWatch {
 public:
  ClientWatch(const httplib::Request& req, std::chrono::milliseconds period)
      : req_(req), period_(period), next_(std::chrono::steady_clock::now() + period) {}
  bool gone() {
    auto now = std::chrono::steady_clock::now();
    if (now < next_) return false;
    next_ = now + period_;
    if (fd_ == kNotLooked) fd_ = connection_socket(req_);
    return peer_closed(fd_);
  }

 private:
  static constexpr int kNotLooked = -2;
  const httplib::Request& req_;
  std::chrono::milliseconds period_;
  std::chrono::steady_clock::time_point next_;
  int fd_ = kNotLooked;
};

}  // namespace wick::serve_http
