#include "tests/support/testing.hpp"
