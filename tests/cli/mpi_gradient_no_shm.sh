# mpi_gradient.sh again with every sum in MPI (KILN_COMM_SHM=0). On one host the sums otherwise
# go through shared memory; this keeps Open MPI's path (MPI_Iallreduce, and kiln's ordered sum in
# point-to-point messages) tested on one host as well as across hosts (mpi_two_hosts.sh).
export KILN_COMM_SHM=0
exec bash "$(dirname "$0")/mpi_gradient.sh" "$@"
