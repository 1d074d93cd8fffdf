// rackhubd --doctor: the TCP listen ports and the state directory (its
// lock and the registry file). doctor.h has the contract.
#include <fcntl.h>
#include <netdb.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "doctor.h"
#include "registry_store.h"

namespace rackhub::server::doctor {
namespace {

std::string Path(const std::string& dir, const char* name) {
  return (std::filesystem::path(dir) / name).string();
}

// The pid a lock file holds (RegistryStore::Open writes it), 0 if none.
long PidInFile(const std::string& path) {
  std::ifstream f(path);
  long pid = 0;
  f >> pid;
  return f ? pid : 0;
}

std::string FreeSpace(const std::string& dir) {
  struct statvfs fs {};
  if (statvfs(dir.c_str(), &fs) != 0) return "";
  const double gib = static_cast<double>(fs.f_bavail) * static_cast<double>(fs.f_frsize) /
                     static_cast<double>(1ull << 30);
  return fmt::format(", {:.1f} GiB free", gib);
}

// False when state.dir exists as something else than a directory, or
// cannot be looked at (the "state dir" row says why): the rows about the
// files in it have nothing to check then.
bool StateDirUsable(const std::string& dir) {
  struct stat st {};
  if (stat(dir.c_str(), &st) == 0) return S_ISDIR(st.st_mode);
  return errno == ENOENT && [&] {
    // Missing is fine when the nearest existing ancestor is a directory.
    std::filesystem::path p = std::filesystem::path(dir).parent_path();
    while (!p.empty() && stat(p.c_str(), &st) != 0 && errno == ENOENT) {
      if (p == p.parent_path()) break;
      p = p.parent_path();
    }
    return p.empty() || (stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode));
  }();
}

// The row `check` about a file in state.dir, skipped and saying why, when
// there is no state directory to look in (state.in_memory: `in_memory`
// says what that means for the file) or it is not usable; else nullopt.
std::optional<Row> SkipWithoutStateDir(const Config& config, const char* check,
                                       const char* in_memory) {
  Row row{check, Verdict::kSkip, {}, ""};
  if (config.state.in_memory) {
    row.detail.push_back(std::string("state.in_memory = true: ") + in_memory);
    return row;
  }
  if (!StateDirUsable(config.state.dir)) {
    row.detail.push_back("state.dir " + config.state.dir + " is not a usable directory (state dir)");
    return row;
  }
  return std::nullopt;
}

}  // namespace

Row CheckTcpPort(const std::string& check, const std::string& field, const net::Endpoint& endpoint,
                 std::optional<long> lock_holder) {
  Row row{check, Verdict::kPass, {}, ""};
  const std::string where = field + " " + endpoint.ToString();
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* ai = nullptr;
  const std::string port = std::to_string(endpoint.port);
  if (const int rc = getaddrinfo(endpoint.host.c_str(), port.c_str(), &hints, &ai); rc != 0) {
    row.verdict = Verdict::kFail;
    row.detail.push_back(where + ": cannot resolve '" + endpoint.host + "': " + gai_strerror(rc));
    row.fix = "set " + field + " to an IP address of this host (or a name that resolves)";
    return row;
  }
  // As the daemon's listeners: the first address, SO_REUSEADDR (a port in
  // TIME_WAIT is free; one with a listener is not), bind, listen.
  int err = 0;
  const char* step = "socket";
  const int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    err = errno;
  } else {
    const int on = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
      err = errno;
      step = "bind";
    } else if (listen(fd, 1) != 0) {
      err = errno;
      step = "listen";
    }
    close(fd);
  }
  freeaddrinfo(ai);
  if (err == 0) {
    row.detail.push_back(where + (endpoint.port == 0 ? ": port 0, the kernel picks a free port"
                                                     : ": free (bind and listen succeeded)"));
    return row;
  }
  row.verdict = Verdict::kFail;
  row.detail.push_back(fmt::format("{}: {}: {}", where, step, std::strerror(err)));
  switch (err) {
    case EADDRINUSE:
      row.detail.back() = where + ": in use (" + step + ": " + std::strerror(err) + ")";
      if (lock_holder) {
        row.detail.push_back(fmt::format(
            "pid {} holds the state directory's lock: probably that rackhubd listens there",
            *lock_holder));
      }
      row.fix = fmt::format(
          "another process listens on {}: `ss -ltnp 'sport = :{}'` names it; stop it or change "
          "{}",
          endpoint.ToString(), endpoint.port, field);
      break;
    case EADDRNOTAVAIL:
      row.fix = fmt::format("{} is not an address of this host: set {} to one (`ip -br addr`), "
                            "127.0.0.1 or 0.0.0.0",
                            endpoint.host, field);
      break;
    case EACCES:
      row.fix = fmt::format("ports below 1024 need CAP_NET_BIND_SERVICE: use a port above 1023 in "
                            "{}, or AmbientCapabilities=CAP_NET_BIND_SERVICE in the unit",
                            field);
      break;
    default:
      row.fix = "change " + field;
  }
  return row;
}

Row CheckStateDir(const Config& config) {
  Row row{"state dir", Verdict::kPass, {}, ""};
  if (config.state.in_memory) {
    row.verdict = Verdict::kSkip;
    row.detail.push_back("state.in_memory = true: nothing is stored");
    return row;
  }
  const std::string& dir = config.state.dir;
  const std::string create_fix =
      "create it for the service's user: `install -d -m 0700 -o USER " + dir +
      "` (a unit with StateDirectory= gets it from systemd), or set state.dir";
  struct stat st {};
  if (stat(dir.c_str(), &st) == 0) {
    if (!S_ISDIR(st.st_mode)) {
      row.verdict = Verdict::kFail;
      row.detail.push_back("state.dir " + dir + ": exists and is not a directory");
      row.fix = "move " + dir + " away or set state.dir to a directory";
      return row;
    }
    // A probe file, removed at once: the only real test of "writable"
    // (read-only mounts, ACLs, root squash) short of writing.
    std::string probe = Path(dir, ".rackhubd-doctor-XXXXXX");
    const int fd = mkstemp(probe.data());
    if (fd < 0) {
      row.verdict = Verdict::kFail;
      row.detail.push_back(fmt::format("state.dir {}: not writable: {}", dir, std::strerror(errno)));
      row.fix = "give the service's user the directory (`chown USER " + dir +
                "`, mode 0700), or set state.dir";
      return row;
    }
    close(fd);
    unlink(probe.c_str());
    row.detail.push_back(fmt::format("state.dir {}: exists, writable (owner uid {}, mode {:04o}{})",
                                     dir, st.st_uid, st.st_mode & 07777, FreeSpace(dir)));
    return row;
  }
  if (errno != ENOENT && errno != ENOTDIR) {
    row.verdict = Verdict::kFail;
    row.detail.push_back(fmt::format("state.dir {}: {}", dir, std::strerror(errno)));
    row.fix = create_fix;
    return row;
  }
  // Missing: rackhubd creates the parents and the directory (0700). Probe
  // the nearest existing ancestor with a directory created and removed.
  std::filesystem::path ancestor = std::filesystem::path(dir).parent_path();
  while (!ancestor.empty() && stat(ancestor.c_str(), &st) != 0 &&
         (errno == ENOENT || errno == ENOTDIR)) {
    if (ancestor == ancestor.parent_path()) break;
    ancestor = ancestor.parent_path();
  }
  if (ancestor.empty()) ancestor = ".";
  if (stat(ancestor.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    row.verdict = Verdict::kFail;
    row.detail.push_back(fmt::format("state.dir {}: does not exist and cannot be created: {} {}",
                                     dir, ancestor.string(),
                                     stat(ancestor.c_str(), &st) != 0 ? std::strerror(errno)
                                                                      : "is not a directory"));
    row.fix = "set state.dir to a path under a directory (" + ancestor.string() + " is a file)";
    return row;
  }
  std::string probe = (ancestor / ".rackhubd-doctor-XXXXXX").string();
  if (!mkdtemp(probe.data())) {
    row.verdict = Verdict::kFail;
    row.detail.push_back(fmt::format("state.dir {}: does not exist and cannot be created in {}: {}",
                                     dir, ancestor.string(), std::strerror(errno)));
    row.fix = create_fix;
    return row;
  }
  rmdir(probe.c_str());
  row.detail.push_back(fmt::format("state.dir {}: does not exist; rackhubd creates it (0700) in {}{}",
                                   dir, ancestor.string(), FreeSpace(ancestor.string())));
  return row;
}

std::optional<long> StateLockHolder(const Config& config) {
  if (config.state.in_memory) return std::nullopt;
  const std::string path = Path(config.state.dir, RegistryStore::kLockFileName);
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) return std::nullopt;
  const long pid_in_file = PidInFile(path);
  // /proc/locks (proc(5)): "1: FLOCK  ADVISORY  WRITE 1234 08:01:5678 0 EOF",
  // device major:minor in hex, inode in decimal; "1: -> FLOCK ..." lines
  // are waiters. Read, not locked: taking the lock even briefly could make
  // a daemon starting at that moment refuse to start.
  std::ifstream locks("/proc/locks");
  std::string line;
  while (std::getline(locks, line)) {
    std::istringstream in(line);
    std::string id, type, mode, access, where;
    long pid = 0;
    in >> id >> type;
    if (type == "->" || type != "FLOCK") continue;
    in >> mode >> access >> pid >> where;
    unsigned major_id = 0, minor_id = 0;
    unsigned long inode = 0;
    if (std::sscanf(where.c_str(), "%x:%x:%lu", &major_id, &minor_id, &inode) != 3) continue;
    if (inode != st.st_ino) continue;
    // Overlay file systems show the lower file system's device here; the
    // pid the daemon wrote into the file then confirms it is our file.
    if ((major_id == major(st.st_dev) && minor_id == minor(st.st_dev)) || pid == pid_in_file) {
      return pid;
    }
  }
  return std::nullopt;
}

Row CheckStateLock(const Config& config, std::optional<long> lock_holder) {
  if (auto skip = SkipWithoutStateDir(config, "state lock", "no state directory")) return *skip;
  Row row{"state lock", Verdict::kPass, {}, ""};
  const std::string path = Path(config.state.dir, RegistryStore::kLockFileName);
  if (access(path.c_str(), F_OK) != 0) {
    row.detail.push_back(path + ": none (no rackhubd has used this state directory)");
    return row;
  }
  if (access("/proc/locks", R_OK) != 0) {
    row.verdict = Verdict::kWarn;
    row.detail.push_back("cannot read /proc/locks: cannot tell whether a rackhubd holds " + path);
    row.fix = "run --doctor where /proc is mounted";
    return row;
  }
  if (lock_holder) {
    row.verdict = Verdict::kFail;
    row.detail.push_back(fmt::format(
        "{} is held by pid {}: a rackhubd is running on this state directory; another one "
        "refuses to start",
        path, *lock_holder));
    row.fix = fmt::format(
        "stop the running rackhubd first (`systemctl stop rackhubd`, or `kill {}`), or give "
        "this one another state.dir",
        *lock_holder);
    return row;
  }
  const long last = PidInFile(path);
  row.detail.push_back(path + ": not held (no rackhubd running on it" +
                       (last > 0 ? fmt::format("; last one was pid {}", last) : std::string()) +
                       ")");
  return row;
}

Row CheckRegistryFile(const Config& config) {
  if (auto skip = SkipWithoutStateDir(config, "registry db", "no registry file")) return *skip;
  Row row{"registry db", Verdict::kPass, {}, ""};
  const std::string path = Path(config.state.dir, RegistryStore::kFileName);
  struct stat st {};
  if (lstat(path.c_str(), &st) != 0) {
    row.detail.push_back(path + ": none yet (rackhubd creates it; tenants start empty)");
    return row;
  }
  const std::string restore_fix =
      "move " + path + " away and restore a good copy (docs/durability.md); without one "
      "rackhubd starts with no tenants";
  if (!S_ISREG(st.st_mode)) {
    row.verdict = Verdict::kFail;
    row.detail.push_back(path + ": not a regular file (rackhubd opens it with O_NOFOLLOW)");
    row.fix = S_ISLNK(st.st_mode) ? "replace the symlink with the file itself" : restore_fix;
    return row;
  }
  // Read the header only, never through SQLite: opening it with SQLite could
  // take its locks or replay a -wal under a running daemon.
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) {
    row.verdict = Verdict::kFail;
    row.detail.push_back(fmt::format("{}: cannot read: {}", path, std::strerror(errno)));
    row.fix = "give the service's user the file (`chown USER " + path + "`, mode 0600)";
    return row;
  }
  unsigned char header[100] = {};
  const ssize_t n = pread(fd, header, sizeof header, 0);
  close(fd);
  static constexpr char kMagic[] = "SQLite format 3";  // 16 bytes with its NUL
  if (n == 0) {
    row.detail.push_back(path + ": empty (SQLite initialises it at start)");
  } else if (n < 100 || std::memcmp(header, kMagic, sizeof kMagic) != 0) {
    row.verdict = Verdict::kFail;
    row.detail.push_back(path + ": not an SQLite 3 database: rackhubd refuses to start (exit 78)");
    row.fix = restore_fix;
    return row;
  } else {
    // Page size: big-endian at offset 16; 1 means 65536 (sqlite.org/fileformat.html).
    const unsigned page = (header[16] << 8 | header[17]) == 1 ? 65536 : (header[16] << 8 | header[17]);
    row.detail.push_back(fmt::format("{}: SQLite 3 database, {} KiB, page size {} (header read "
                                     "only, not opened)",
                                     path, (st.st_size + 1023) / 1024, page));
  }
  if (access(path.c_str(), R_OK | W_OK) != 0) {
    row.verdict = Verdict::kFail;
    row.detail.push_back(fmt::format("{}: not writable: {}", path, std::strerror(errno)));
    row.fix = "give the service's user the file (`chown USER " + path + "`, mode 0600)";
    return row;
  }
  struct stat wal {};
  if (stat((path + "-wal").c_str(), &wal) == 0 && wal.st_size > 0) {
    row.detail.push_back(fmt::format(
        "{}-wal: {} KiB (a running rackhubd, or changes SQLite applies at the next start)", path,
        (wal.st_size + 1023) / 1024));
  }
  return row;
}

}  // namespace rackhub::server::doctor
