// One include for Catch2 v3 (current distributions, the GPU machine) and v2.13 (Debian 12, CI).
#pragma once

#if __has_include(<catch2/catch_test_macros.hpp>)
#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <catch2/generators/catch_generators_range.hpp>
#include <catch2/matchers/catch_matchers.hpp>  // CHECK_THROWS_WITH (v2 has it in catch.hpp)
#define FS_CATCH_MAJOR 3
#else
#include <catch2/catch.hpp>
#define FS_CATCH_MAJOR 2
#endif
