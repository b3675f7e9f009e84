// The one way a test file includes doctest in this repository.
//
// Debian's LibTorch is built with glog, whose logging.h defines CHECK, CHECK_EQ, ... . If doctest came first,
// glog's macros would silently replace doctest's: assertions would count zero and a failure would abort the
// binary. So: torch's core headers first, then glog's CHECK family removed, then doctest.
#pragma once

#ifdef DOCTEST_LIBRARY_INCLUDED
#error "Include tests/torch_doctest.h instead of doctest.h: doctest must come after torch's headers."
#endif

#include <c10/util/Logging.h>  // brings glog's macros where LibTorch uses glog; no-op otherwise

#undef CHECK
#undef CHECK_EQ
#undef CHECK_NE
#undef CHECK_LT
#undef CHECK_LE
#undef CHECK_GT
#undef CHECK_GE
#undef CHECK_NOTNULL
#undef CHECK_STREQ
#undef CHECK_STRNE
#undef CHECK_STRCASEEQ
#undef CHECK_STRCASENE
#undef CHECK_INDEX
#undef CHECK_BOUND
#undef CHECK_DOUBLE_EQ
#undef CHECK_NEAR
#undef CHECK_ERR
#undef CHECK_OP
#undef CHECK_OP_LOG
#undef CHECK_STROP

#include <doctest/doctest.h>

#include <string>

#include <c10/core/ScalarType.h>

#include "tests/devices.h"

// doctest cannot print a c10::ScalarType (c10's own toString(ScalarType) returns a const char* and wins
// overload resolution), so checks compare dtype names: CHECK(dtype_name(t.scalar_type()) == "BFloat16").
inline std::string dtype_name(c10::ScalarType dtype) { return c10::toString(dtype); }
