/* freeze_thread PID NAME_PREFIX
 *
 * Stops exactly one thread of process PID: the first (lowest TID) whose
 * /proc/PID/task/TID/comm starts with NAME_PREFIX (e.g. "rackhub-lane0"),
 * and keeps it stopped while the rest of the process runs on. It attaches
 * with ptrace(PTRACE_SEIZE) and stops the thread with PTRACE_INTERRUPT:
 * ptrace acts on single threads, so unlike SIGSTOP (which stops the whole
 * thread group) only that thread freezes, as if it hung in a lane handler.
 * Used by tests/systemd/checks.sh to make rackhubd miss its watchdog without
 * test hooks in the daemon.
 *
 * Prints "frozen TID" once the thread is stopped, then waits: the thread
 * stays stopped until the tracee dies (exit 0 then, after printing how it
 * ended) or this process is killed (the kernel detaches and the thread runs
 * on). Exit status: 0 the frozen thread's process ended; 1 no such thread or
 * ptrace failed (the message says which); 2 usage error.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ptrace.h>
#include <sys/types.h>
#include <sys/wait.h>

/* Returns the lowest TID of PID whose comm starts with prefix, or -1. */
static pid_t FindThread(pid_t pid, const char* prefix) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
  DIR* dir = opendir(path);
  if (dir == NULL) {
    fprintf(stderr, "freeze_thread: %s: %s\n", path, strerror(errno));
    return -1;
  }
  pid_t found = -1;
  for (struct dirent* e; (e = readdir(dir)) != NULL;) {
    if (e->d_name[0] == '.') continue;
    char comm_path[512], comm[32] = "";
    snprintf(comm_path, sizeof comm_path, "%s/%s/comm", path, e->d_name);
    FILE* f = fopen(comm_path, "r");
    if (f == NULL) continue; /* the thread just exited */
    if (fgets(comm, sizeof comm, f) == NULL) comm[0] = '\0';
    fclose(f);
    const pid_t tid = (pid_t)atoi(e->d_name);
    if (strncmp(comm, prefix, strlen(prefix)) == 0 && (found < 0 || tid < found)) found = tid;
  }
  closedir(dir);
  return found;
}

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: freeze_thread PID NAME_PREFIX\n");
    return 2;
  }
  const pid_t pid = (pid_t)atoi(argv[1]);
  const pid_t tid = FindThread(pid, argv[2]);
  if (tid < 0) {
    fprintf(stderr, "freeze_thread: process %s has no thread named '%s*'\n", argv[1], argv[2]);
    return 1;
  }
  if (ptrace(PTRACE_SEIZE, tid, NULL, NULL) != 0) {
    fprintf(stderr, "freeze_thread: PTRACE_SEIZE %d: %s\n", (int)tid, strerror(errno));
    return 1;
  }
  if (ptrace(PTRACE_INTERRUPT, tid, NULL, NULL) != 0) {
    fprintf(stderr, "freeze_thread: PTRACE_INTERRUPT %d: %s\n", (int)tid, strerror(errno));
    return 1;
  }
  int status = 0;
  if (waitpid(tid, &status, __WALL) != tid || !WIFSTOPPED(status)) {
    fprintf(stderr, "freeze_thread: thread %d did not stop (wait status %#x)\n", (int)tid, status);
    return 1;
  }
  printf("frozen %d\n", (int)tid);
  fflush(stdout);
  /* Never resume it: each further stop (another ptrace event) is left as is.
   * The thread leaves only by dying with its process. */
  for (;;) {
    if (waitpid(tid, &status, __WALL) < 0) {
      if (errno == EINTR) continue;
      printf("thread %d gone (%s)\n", (int)tid, strerror(errno));
      return 0;
    }
    if (WIFEXITED(status) || WIFSIGNALED(status)) {
      printf("thread %d ended (%s %d)\n", (int)tid, WIFEXITED(status) ? "exit" : "signal",
             WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
      return 0;
    }
  }
}
