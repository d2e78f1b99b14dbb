/* SIMULATION (TEST DOUBLE): each sandbox host's own network stack, for every process of its user.
 *
 * The sandbox hosts share this machine's one network stack; a real GPU host has its own. Two real
 * hosts both bind 0.0.0.0:30000 and each answers on its own 127.0.0.1; here they would collide, and
 * host B's 127.0.0.1 would be host A's. Preloaded (LD_PRELOAD, set by the host's sshd SetEnv and
 * dotfiles) into that host's processes: the stand-in SGLang, deployctl's host-side helpers (which
 * run `python3 -I -S`, so no Python-level hook would reach them), the routers' Rust cores. For them:
 *
 *   bind()    to 0.0.0.0 / :: / 127.0.0.1 / ::1 binds $SANDBOX_OWN_ADDRESS (a real host's wildcard
 *             bind answers from the network on its address);
 *   connect() to 127.0.0.1 / ::1 goes to $SANDBOX_OWN_ADDRESS (the host's own loopback).
 *
 * A worker URL naming 127.0.0.1 in a router on host A therefore reaches A's replica only, as on a
 * real network. Without SANDBOX_OWN_ADDRESS (an IPv4 127.x address) nothing changes.
 * Built by sandbox/hosts.py with the system C compiler (tests/bootstrap.sh installs gcc).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

static struct in_addr own;
static int have = -1;

static int ready(void) {
    if (have < 0) {
        const char *text = getenv("SANDBOX_OWN_ADDRESS");
        have = text != NULL && strncmp(text, "127.", 4) == 0 && inet_pton(AF_INET, text, &own) == 1;
    }
    return have;
}

static int v4_mapped_loopback(const struct in6_addr *a) {
    static const unsigned char prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    return memcmp(a->s6_addr, prefix, 12) == 0 && a->s6_addr[12] == 127 && a->s6_addr[13] == 0 &&
           a->s6_addr[14] == 0 && a->s6_addr[15] == 1;
}

/* the rewritten address in *out and its length, or 0 to use the caller's */
static socklen_t rewrite(const struct sockaddr *addr, socklen_t len, struct sockaddr_storage *out, int binding) {
    if (addr == NULL || !ready())
        return 0;
    if (addr->sa_family == AF_INET && len >= (socklen_t)sizeof(struct sockaddr_in)) {
        struct sockaddr_in in;
        memcpy(&in, addr, sizeof in);
        uint32_t a = ntohl(in.sin_addr.s_addr);
        if (a == INADDR_LOOPBACK || (binding && a == INADDR_ANY)) {
            in.sin_addr = own;
            memcpy(out, &in, sizeof in);
            return sizeof in;
        }
    } else if (addr->sa_family == AF_INET6 && len >= (socklen_t)sizeof(struct sockaddr_in6)) {
        struct sockaddr_in6 in6;
        memcpy(&in6, addr, sizeof in6);
        if (IN6_IS_ADDR_LOOPBACK(&in6.sin6_addr) || v4_mapped_loopback(&in6.sin6_addr) ||
            (binding && IN6_IS_ADDR_UNSPECIFIED(&in6.sin6_addr))) {
            memset(&in6.sin6_addr, 0, sizeof in6.sin6_addr);
            in6.sin6_addr.s6_addr[10] = 0xff; /* ::ffff:own, on a dual-stack socket */
            in6.sin6_addr.s6_addr[11] = 0xff;
            memcpy(&in6.sin6_addr.s6_addr[12], &own, 4);
            memcpy(out, &in6, sizeof in6);
            return sizeof in6;
        }
    }
    return 0;
}

int bind(int fd, const struct sockaddr *addr, socklen_t len) {
    static int (*real)(int, const struct sockaddr *, socklen_t);
    struct sockaddr_storage mapped;
    socklen_t n;
    if (real == NULL)
        real = (int (*)(int, const struct sockaddr *, socklen_t))dlsym(RTLD_NEXT, "bind");
    n = rewrite(addr, len, &mapped, 1);
    return n ? real(fd, (struct sockaddr *)&mapped, n) : real(fd, addr, len);
}

int connect(int fd, const struct sockaddr *addr, socklen_t len) {
    static int (*real)(int, const struct sockaddr *, socklen_t);
    struct sockaddr_storage mapped;
    socklen_t n;
    if (real == NULL)
        real = (int (*)(int, const struct sockaddr *, socklen_t))dlsym(RTLD_NEXT, "connect");
    n = rewrite(addr, len, &mapped, 0);
    return n ? real(fd, (struct sockaddr *)&mapped, n) : real(fd, addr, len);
}
