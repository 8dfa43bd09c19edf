/* netaddr.c - address parsing, resolution and interface selection (see netaddr.h). */
#include "util/netaddr.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int hoop__split_hostport(const char *text, char *host, size_t hostlen, int *port) {
  const char *colon;
  size_t hlen;
  if (text[0] == '[') {
    const char *close = strchr(text, ']');
    if (!close || close[1] != ':')
      return -1;
    hlen = (size_t)(close - text - 1);
    text++;
    colon = close + 1;
  } else {
    colon = strrchr(text, ':');
    if (!colon)
      return -1;
    hlen = (size_t)(colon - text);
  }
  if (hlen >= hostlen)
    return -1;
  memcpy(host, text, hlen);
  host[hlen] = '\0';
  char *end;
  errno = 0;
  long value = strtol(colon + 1, &end, 10);
  if (errno || end == colon + 1 || *end || value < 0 || value > 65535)
    return -1;
  *port = (int)value;
  return 0;
}

int hoop__resolve(const char *host, int port, struct sockaddr_storage *addr, socklen_t *addrlen,
                  char *err, size_t errlen) {
  struct addrinfo hints, *res = NULL;
  memset(&hints, 0, sizeof hints);
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = host[0] ? 0 : AI_PASSIVE;
  char service[16];
  snprintf(service, sizeof service, "%d", port);
  int rc = getaddrinfo(host[0] ? host : NULL, service, &hints, &res);
  if (rc != 0) {
    snprintf(err, errlen, "cannot resolve '%s': %s", host, gai_strerror(rc));
    return -1;
  }
  memcpy(addr, res->ai_addr, res->ai_addrlen);
  *addrlen = res->ai_addrlen;
  freeaddrinfo(res);
  return 0;
}

int hoop__is_loopback(const struct sockaddr *addr) {
  if (addr->sa_family == AF_INET)
    return (ntohl(((const struct sockaddr_in *)addr)->sin_addr.s_addr) >> 24) == 127;
  return addr->sa_family == AF_INET6 &&
         IN6_IS_ADDR_LOOPBACK(&((const struct sockaddr_in6 *)addr)->sin6_addr);
}

void hoop__format_sockaddr(const struct sockaddr *addr, char *out, size_t outlen) {
  char ip[INET6_ADDRSTRLEN] = "?";
  if (addr->sa_family == AF_INET) {
    const struct sockaddr_in *in = (const struct sockaddr_in *)addr;
    inet_ntop(AF_INET, &in->sin_addr, ip, sizeof ip);
    snprintf(out, outlen, "%s:%d", ip, ntohs(in->sin_port));
  } else if (addr->sa_family == AF_INET6) {
    const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)addr;
    inet_ntop(AF_INET6, &in6->sin6_addr, ip, sizeof ip);
    snprintf(out, outlen, "[%s]:%d", ip, ntohs(in6->sin6_port));
  } else {
    snprintf(out, outlen, "(family %d)", addr->sa_family);
  }
}

void hoop__format_host(const struct sockaddr *addr, char *out, size_t outlen) {
  hoop__format_sockaddr(addr, out, outlen);
  char *colon = strrchr(out, ':'); /* both families end with ":port" */
  if (colon && (addr->sa_family == AF_INET || addr->sa_family == AF_INET6))
    *colon = '\0';
}

int hoop__ifname_matches(const char *spec, const char *name) {
  int exclude = 0, exact = 0;
  if (*spec == '^') {
    exclude = 1;
    spec++;
  }
  if (*spec == '=') {
    exact = 1;
    spec++;
  }
  int matched = 0;
  const char *p = spec;
  while (*p && !matched) {
    const char *comma = strchr(p, ',');
    size_t len = comma ? (size_t)(comma - p) : strlen(p);
    if (len > 0) {
      if (exact)
        matched = strlen(name) == len && strncmp(name, p, len) == 0;
      else
        matched = strncmp(name, p, len) == 0;
    }
    p += len + (comma ? 1 : 0);
  }
  return exclude ? !matched : matched;
}

/* The local address the kernel would use to reach toward: connect a UDP socket (no packet is sent)
 * and read its name. */
static int route_source(const struct sockaddr *toward, struct sockaddr_storage *out,
                        socklen_t *outlen, char *err, size_t errlen) {
  socklen_t len =
      toward->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
  int fd = socket(toward->sa_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    snprintf(err, errlen, "socket: %s", strerror(errno));
    return -1;
  }
  if (connect(fd, toward, len) != 0) {
    snprintf(err, errlen, "no route toward the rendezvous server: %s", strerror(errno));
    close(fd);
    return -1;
  }
  *outlen = sizeof *out;
  int rc = getsockname(fd, (struct sockaddr *)out, outlen);
  if (rc != 0)
    snprintf(err, errlen, "getsockname: %s", strerror(errno));
  close(fd);
  return rc;
}

int hoop__same_ip(const struct sockaddr *a, const struct sockaddr *b) {
  if (a->sa_family != b->sa_family)
    return 0;
  if (a->sa_family == AF_INET)
    return memcmp(&((const struct sockaddr_in *)a)->sin_addr,
                  &((const struct sockaddr_in *)b)->sin_addr, sizeof(struct in_addr)) == 0;
  return a->sa_family == AF_INET6 &&
         memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr,
                &((const struct sockaddr_in6 *)b)->sin6_addr, sizeof(struct in6_addr)) == 0;
}

int hoop__interface_of(const struct sockaddr *addr, char *name, size_t namelen) {
  struct ifaddrs *list = NULL;
  int found = 0;
  snprintf(name, namelen, "?");
  if (getifaddrs(&list) != 0)
    return 0;
  for (struct ifaddrs *ifa = list; ifa; ifa = ifa->ifa_next) {
    if (!ifa->ifa_addr || ifa->ifa_addr->sa_family != addr->sa_family)
      continue;
    if (hoop__same_ip(ifa->ifa_addr, addr)) {
      snprintf(name, namelen, "%s", ifa->ifa_name);
      found = 1;
      break;
    }
  }
  freeifaddrs(list);
  return found;
}

/* The first usable address of an interface matching spec; IPv4 wins over IPv6. IPv6 link-local
 * addresses are skipped (peers could not reach them without a scope), and so is loopback when the
 * spec only excludes ("^docker"): a loopback address is used only when the spec names it. */
static int address_from_spec(const char *spec, struct sockaddr_storage *out, socklen_t *outlen,
                             char *chosen, size_t chosenlen, char *err, size_t errlen) {
  struct ifaddrs *list = NULL;
  if (getifaddrs(&list) != 0) {
    snprintf(err, errlen, "getifaddrs: %s", strerror(errno));
    return -1;
  }
  const struct ifaddrs *best = NULL;
  int best_score = 0;
  for (const struct ifaddrs *ifa = list; ifa; ifa = ifa->ifa_next) {
    if (!ifa->ifa_addr || !(ifa->ifa_flags & IFF_UP))
      continue;
    int family = ifa->ifa_addr->sa_family;
    if ((family != AF_INET && family != AF_INET6) || !hoop__ifname_matches(spec, ifa->ifa_name))
      continue;
    if ((ifa->ifa_flags & IFF_LOOPBACK) && spec[0] == '^')
      continue;
    if (family == AF_INET6 &&
        IN6_IS_ADDR_LINKLOCAL(&((const struct sockaddr_in6 *)ifa->ifa_addr)->sin6_addr))
      continue;
    int score = family == AF_INET ? 2 : 1;
    if (score > best_score) {
      best = ifa;
      best_score = score;
    }
  }
  if (!best) {
    snprintf(err, errlen,
             "HOOP_IFNAME='%s' matches no interface that is up with a usable address "
             "(loopback counts only when named; IPv6 link-local never)",
             spec);
    freeifaddrs(list);
    return -1;
  }
  *outlen = best->ifa_addr->sa_family == AF_INET ? sizeof(struct sockaddr_in)
                                                 : sizeof(struct sockaddr_in6);
  memset(out, 0, sizeof *out);
  memcpy(out, best->ifa_addr, *outlen);
  snprintf(chosen, chosenlen, "%s", best->ifa_name);
  freeifaddrs(list);
  return 0;
}

int hoop__choose_local_addr(const char *ifname_spec, const struct sockaddr *toward,
                            struct sockaddr_storage *out, socklen_t *outlen, char *chosen,
                            size_t chosenlen, char *err, size_t errlen) {
  int rc;
  if (ifname_spec && ifname_spec[0]) {
    rc = address_from_spec(ifname_spec, out, outlen, chosen, chosenlen, err, errlen);
  } else {
    rc = route_source(toward, out, outlen, err, errlen);
    if (rc == 0)
      hoop__interface_of((const struct sockaddr *)out, chosen, chosenlen);
  }
  if (rc == 0) {
    if (out->ss_family == AF_INET)
      ((struct sockaddr_in *)out)->sin_port = 0;
    else
      ((struct sockaddr_in6 *)out)->sin6_port = 0;
  }
  return rc;
}
