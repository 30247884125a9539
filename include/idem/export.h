// IDEM_EXPORT marks idem's public classes and functions. The library is compiled with hidden
// symbols (-fvisibility=hidden), so a shared libidem exports exactly what carries this mark.
#pragma once

#if defined(__GNUC__)
#define IDEM_EXPORT __attribute__((visibility("default")))
#else
#define IDEM_EXPORT
#endif
