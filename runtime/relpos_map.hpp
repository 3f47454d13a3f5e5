// Relative-position maps (REFERENCE.md section 2).
#pragma once
