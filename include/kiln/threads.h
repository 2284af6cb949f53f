/* The kernels' thread count. */
#ifndef KILN_THREADS_H
#define KILN_THREADS_H


/* Sets the threads used by kernels (OpenMP) and by the BLAS library together. */
void kiln_set_num_threads(int n);
int kiln_get_num_threads(void);

#endif
