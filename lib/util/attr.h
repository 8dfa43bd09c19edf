/* attr.h - compiler attributes the whole tree uses. */
#ifndef HOOP__ATTR_H
#define HOOP__ATTR_H

/* A function taking a printf format at argument a, its arguments from b. */
#if defined(__GNUC__)
#define HOOP__PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define HOOP__PRINTF(a, b)
#endif

#endif /* HOOP__ATTR_H */
