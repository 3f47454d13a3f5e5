#include "frontend/parser.hpp"
