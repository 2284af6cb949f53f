/* Test support: finite-difference gradient checks of layers (Caffe's method) and small helpers. */
#ifndef KILN_TEST_GRADCHECK_H
#define KILN_TEST_GRADCHECK_H
#endif
