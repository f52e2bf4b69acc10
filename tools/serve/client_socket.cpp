#include "serve/client_socket.h"

#include <dirent.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <array>
#include <cerrno>
#include <cstdlib>
#include <string>

namespace wick::serve_http {

namespace {

// An address as httplib 0.11 writes it into Request::remote_addr / local_addr; false for
// families without a port (a Unix socket).
bool format_address(const sockaddr_storage& addr, socklen_t len, std::string& ip, int& port) {
  if (addr.ss_family == AF_INET) {
    port = ntohs(reinterpret_cast<const sockaddr_in*>(&addr)->sin_port);
  } else if (addr.ss_family == AF_INET6) {
    port = ntohs(reinterpret_cast<const sockaddr_in6*>(&addr)->sin6_port);
  } else {
    return false;
  }
  std::array<char, NI_MAXHOST> host{};
  if (::getnameinfo(reinterpret_cast<const sockaddr*>(&addr), len, host.data(),
                    static_cast<socklen_t>(host.size()), nullptr, 0, NI_NUMERICHOST) != 0) {
    return false;
  }
  ip = host.data();
  return true;
}

bool endpoint_is(int fd, bool peer, const std::string& ip, int port) {
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  auto* sa = reinterpret_cast<sockaddr*>(&addr);
  if ((peer ? ::getpeername(fd, sa, &len) : ::getsockname(fd, sa, &len)) != 0) return false;
  std::string got_ip;
  int got_port = -1;
  return format_address(addr, len, got_ip, got_port) && got_port == port && got_ip == ip;
}

}  // namespace

int connection_socket(const httplib::Request& req) {
  if (req.remote_addr.empty() || req.local_addr.empty()) return -1;
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  const int own = ::dirfd(dir);
  int found = -1;
  while (const dirent* entry = ::readdir(dir)) {
    char* end = nullptr;
    long fd = std::strtol(entry->d_name, &end, 10);
    if (end == entry->d_name || *end != '\0' || fd == own) continue;
    // The local end first: it rules out most sockets (those of other ports) with one call.
    if (endpoint_is(static_cast<int>(fd), false, req.local_addr, req.local_port) &&
        endpoint_is(static_cast<int>(fd), true, req.remote_addr, req.remote_port)) {
      found = static_cast<int>(fd);
      break;
    }
  }
  ::closedir(dir);
  return found;
}

bool peer_closed(int fd) {
  if (fd < 0) return false;
  pollfd p{fd, static_cast<short>(POLLIN | POLLRDHUP), 0};
  if (::poll(&p, 1, 0) <= 0) return false;
  if (p.revents & POLLNVAL) return false;  // not an open descriptor: nothing is known
  if (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) return true;
  if (p.revents & POLLIN) {
    // Readable: the next request of a pipelining client, or the end of the stream.
    char c = 0;
    ssize_t n = ::recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n == 0) return true;
    if (n < 0) return errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
  }
  return false;
}

}  // namespace wick::serve_http
