/* netaddr.h - "host:port" parsing and formatting for IPv4 and IPv6, and interface selection with
 * NCCL_SOCKET_IFNAME's syntax. Shared by the rendezvous client and server and the TCP transport. */
#ifndef HOOP__NETADDR_H
#define HOOP__NETADDR_H

#include <stddef.h>
#include <sys/socket.h>

/* Split "host:port", "[v6addr]:port" or ":port" into host (may become "") and port.
 * Returns 0, or -1 if the text is malformed or the port is not in 0..65535. */
int hoop__split_hostport(const char *text, char *host, size_t hostlen, int *port);

/* Resolve host (a name or a literal; "" means the wildcard address) and port into addr.
 * Returns 0, or -1 with a message in err. */
int hoop__resolve(const char *host, int port, struct sockaddr_storage *addr, socklen_t *addrlen,
                  char *err, size_t errlen);

/* 1 if addr is IPv4 127/8 or IPv6 ::1. */
int hoop__is_loopback(const struct sockaddr *addr);

/* 1 if a and b hold the same IPv4 or IPv6 address, their ports aside; else 0. */
int hoop__same_ip(const struct sockaddr *a, const struct sockaddr *b);

/* 1 if addr (its port aside) is an address of one of this host's interfaces, whose name goes into
 * name; else 0 and "?". */
int hoop__interface_of(const struct sockaddr *addr, char *name, size_t namelen);

/* "1.2.3.4:5" or "[::1]:5". */
void hoop__format_sockaddr(const struct sockaddr *addr, char *out, size_t outlen);
/* The same without the port: "1.2.3.4" or "[::1]" (where connections come from, for limits). */
void hoop__format_host(const struct sockaddr *addr, char *out, size_t outlen);

/* Choose the local address for this rank's listener.
 * With ifname_spec non-empty: the first address (IPv4 preferred) of the first interface matching
 * the spec (prefixes separated by commas; "^" excludes the listed prefixes; "=" matches exact
 * names). Otherwise: the local address that routes to toward (the rendezvous server).
 * Port is left 0. Returns 0, or -1 with a message in err. On success chosen names the interface
 * (or the route) for the log. */
int hoop__choose_local_addr(const char *ifname_spec, const struct sockaddr *toward,
                            struct sockaddr_storage *out, socklen_t *outlen, char *chosen,
                            size_t chosenlen, char *err, size_t errlen);

/* 1 if name matches the spec (the syntax above). */
int hoop__ifname_matches(const char *spec, const char *name);

#endif /* HOOP__NETADDR_H */
