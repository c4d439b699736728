// doctest as every libwkv test includes it (never <doctest/doctest.h> directly).
//
// Why: doctest 2.4.9 (Debian 12's doctest-dev, also the copy scripts/device.sh carries) logs a
// `const char*` given to INFO or CAPTURE as its address (its `filldata<T*>` prints pointers),
// so a failing test showed "msg := 0x55b8..." instead of the library's message. These two
// specialisations print the characters. Declared once here, after doctest's own templates and
// before any test names them, so every test file sees the same definition.
#ifndef WKV_TESTS_WKV_DOCTEST_H
#define WKV_TESTS_WKV_DOCTEST_H

#include <doctest/doctest.h>

#include <ostream>

#if DOCTEST_VERSION_MAJOR == 2 && DOCTEST_VERSION_MINOR == 4 && DOCTEST_VERSION_PATCH >= 9
namespace doctest {
namespace detail {
template <>
struct filldata<const char*> {
    static void fill(std::ostream* stream, const char* in) { *stream << (in ? in : "(null)"); }
};
template <>
struct filldata<char*> {
    static void fill(std::ostream* stream, const char* in) { *stream << (in ? in : "(null)"); }
};
} // namespace detail
} // namespace doctest
#endif

#endif
