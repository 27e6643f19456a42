/* LD_PRELOAD shim for local tasks: a bind() to a wildcard address (0.0.0.0 or ::) becomes a
 * bind to loopback (127.0.0.1, or ::ffff:127.0.0.1 for a dual-stack socket).  TensorFlow's gRPC
 * servers listen on all interfaces whatever TF_CONFIG says; with this they are reachable from
 * this machine only.  Built by tfk8s_magics.isolation.shim.
 * A warm-pool process preloads it before it knows its task; a task that must not have it (one in a
 * private network namespace) sets tfk8s_loopback_bind_off to 1: every bind() then passes through. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>

typedef int (*bind_fn)(int, const struct sockaddr *, socklen_t);

int tfk8s_loopback_bind_off = 0;

int bind(int fd, const struct sockaddr *addr, socklen_t len) {
    static bind_fn real_bind;
    if (!real_bind) real_bind = (bind_fn)dlsym(RTLD_NEXT, "bind");
    if (tfk8s_loopback_bind_off) return real_bind(fd, addr, len);
    if (addr && addr->sa_family == AF_INET && len >= sizeof(struct sockaddr_in)) {
        struct sockaddr_in a;
        memcpy(&a, addr, sizeof a);
        if (a.sin_addr.s_addr == htonl(INADDR_ANY)) {
            a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
            return real_bind(fd, (struct sockaddr *)&a, sizeof a);
        }
    } else if (addr && addr->sa_family == AF_INET6 && len >= sizeof(struct sockaddr_in6)) {
        struct sockaddr_in6 a;
        memcpy(&a, addr, sizeof a);
        if (memcmp(&a.sin6_addr, &in6addr_any, sizeof a.sin6_addr) == 0) {
            /* ::ffff:127.0.0.1 keeps a dual-stack socket reachable at 127.0.0.1 only. */
            static const unsigned char mapped[16] = {0,0,0,0,0,0,0,0,0,0,0xff,0xff,127,0,0,1};
            memcpy(&a.sin6_addr, mapped, sizeof mapped);
            return real_bind(fd, (struct sockaddr *)&a, sizeof a);
        }
    }
    return real_bind(fd, addr, len);
}
