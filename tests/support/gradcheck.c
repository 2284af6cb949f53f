/* Test support: finite-difference gradient checker (filled in with the layer tests). */
#include "gradcheck.h"
int kiln_gradcheck_placeholder_;
