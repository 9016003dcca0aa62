// The Catch2 session, for the one file that defines main(): v3 ships it as a library, v2.13 builds
// it in the translation unit that defines CATCH_CONFIG_RUNNER.
#pragma once

#if __has_include(<catch2/catch_session.hpp>)
#include <catch2/catch_session.hpp>
#else
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#endif
