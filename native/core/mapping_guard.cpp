// A mapped file read past its end is a SIGBUS, which kills the process with
// "Bus error" and nothing else: a model file truncated while it is loaded (`cp`
// over it, a download rewriting it in place), or a snapshot store's data file
// whose pages point past its end (a damaged copy). The mappings of the loaded
// GGUF files and of the stores are registered here, each with what it is and
// what to do; a SIGBUS whose address falls in one first says so on stderr, then
// takes its course as before (the previous handler, faulthandler's under
// pytest, or the default action: the process still dies, since the bytes it
// was reading are gone).
#include <pybind11/pybind11.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>

#if defined(__unix__) || defined(__APPLE__)
#include <signal.h>
#include <unistd.h>
#define CTX_HAVE_SIGBUS_GUARD 1
#endif

namespace py = pybind11;

namespace ctx {

#ifdef CTX_HAVE_SIGBUS_GUARD
namespace {

constexpr int kSlots = 256;
constexpr size_t kTextBytes = 480;

struct Slot {
  std::atomic<uintptr_t> begin{0};  // 0: free; set last (release), cleared first
  uintptr_t end = 0;
  char what[kTextBytes] = {};
  char why[kTextBytes] = {};
};

Slot g_slots[kSlots];
std::mutex g_register;  // registrations only; the handler reads without it
struct sigaction g_previous;
bool g_installed = false;

void put(const char* s) {
  size_t n = std::strlen(s);
  while (n > 0) {
    ssize_t w = write(2, s, n);
    if (w <= 0) return;
    s += w;
    n -= static_cast<size_t>(w);
  }
}

void put_number(uintptr_t v) {
  char buf[24];
  int i = sizeof buf - 1;
  buf[i] = '\0';
  do {
    buf[--i] = static_cast<char>('0' + v % 10);
    v /= 10;
  } while (v != 0 && i > 0);
  put(buf + i);
}

void on_sigbus(int sig, siginfo_t* info, void* uctx) {
  const auto at = reinterpret_cast<uintptr_t>(info->si_addr);
  for (const Slot& s : g_slots) {
    const uintptr_t b = s.begin.load(std::memory_order_acquire);
    if (b != 0 && at >= b && at < s.end) {
      put("ctxengine: SIGBUS reading ");
      put(s.what);
      put(" at byte ");
      put_number(at - b);
      put(": ");
      put(s.why);
      put("\n");
      break;
    }
  }
  if (g_previous.sa_flags & SA_SIGINFO) {
    g_previous.sa_sigaction(sig, info, uctx);
  } else if (g_previous.sa_handler != SIG_DFL && g_previous.sa_handler != SIG_IGN) {
    g_previous.sa_handler(sig);
  } else {
    signal(sig, SIG_DFL);  // returning re-runs the faulting read, which now ends the process
  }
}

void copy_text(char* to, const std::string& from) {
  std::strncpy(to, from.c_str(), kTextBytes - 1);
  to[kTextBytes - 1] = '\0';
}

void guard(uintptr_t begin, size_t size, const std::string& what, const std::string& why) {
  if (begin == 0 || size == 0) return;
  std::lock_guard<std::mutex> lock(g_register);
  if (!g_installed) {
    struct sigaction sa;
    std::memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGBUS, &sa, &g_previous) != 0) return;
    g_installed = true;
  }
  for (Slot& s : g_slots) {
    if (s.begin.load(std::memory_order_relaxed) == 0) {
      s.end = begin + size;
      copy_text(s.what, what);
      copy_text(s.why, why);
      s.begin.store(begin, std::memory_order_release);
      return;
    }
  }  // every slot taken: this mapping goes unnamed, as before
}

void unguard(uintptr_t begin) {
  std::lock_guard<std::mutex> lock(g_register);
  for (Slot& s : g_slots) {
    if (s.begin.load(std::memory_order_relaxed) == begin) s.begin.store(0, std::memory_order_release);
  }
}

}  // namespace
#endif

void register_mapping_guard(py::module_& m) {
#ifdef CTX_HAVE_SIGBUS_GUARD
  m.def("guard_mapping", &guard, py::arg("address"), py::arg("size"), py::arg("what"), py::arg("why"),
        "say what and why on stderr if a read of [address, address + size) raises SIGBUS (a file cut short)");
  m.def("unguard_mapping", &unguard, py::arg("address"), "forget a mapping guard_mapping registered");
#else
  m.def("guard_mapping", [](uintptr_t, size_t, const std::string&, const std::string&) {}, py::arg("address"),
        py::arg("size"), py::arg("what"), py::arg("why"), "no-op where SIGBUS does not exist");
  m.def("unguard_mapping", [](uintptr_t) {}, py::arg("address"), "no-op where SIGBUS does not exist");
#endif
}

}  // namespace ctx
