/* libdtensor: symbol visibility macro for the public API. */
#ifndef DTENSOR_EXPORT_H
#define DTENSOR_EXPORT_H

#if defined(DT_BUILDING_LIBRARY) && defined(__GNUC__)
#define DT_API __attribute__((visibility("default")))
#else
#define DT_API
#endif

#endif
