#pragma once
// Which ranks run on the same GPU: NCCL refuses two ranks of a communicator on one device, so
// comm.backend = "auto" must know before it picks NCCL (backend.hpp).
#include <mpi.h>

#include "comm/backend.hpp"

namespace tessera::comm {

/// \brief The most ranks of any node of `world` whose current CUDA device is the same one (by
/// PCI bus id, so ranks that see different CUDA_VISIBLE_DEVICES are told apart); 1 where no
/// rank has a device. Collective over world; every rank gets the same answer.
DeviceSharing detect_device_sharing(MPI_Comm world);

}  // namespace tessera::comm
