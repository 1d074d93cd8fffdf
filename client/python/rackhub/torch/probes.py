"""Horovod's build probes and topology getters, answered truthfully for
rackhub (docs/pytorch.md lists where they differ from Horovod and why).

rackhub moves every collective through the hub's data plane (TCP, shared
memory or RDMA verbs); it has no MPI, Gloo, NCCL, DDL or oneCCL
controller or operations, so those probes are False. cuda_built and
rocm_built say what the torch in use was built with (CUDA tensors are
staged through host memory; the hub never sees the GPU).

cross_rank, cross_size, is_homogeneous come from every rank's host and
local rank, which init() exchanges.

This module imports only _context.
"""
import torch

from . import _context


def mpi_built():
    """False: rackhub does not use MPI."""
    return False


def mpi_enabled():
    """False: rackhub does not use MPI."""
    return False


def mpi_threads_supported():
    """False: there is no MPI (Horovod raises ValueError when it was built
    without MPI; rackhub answers False, the truth, without an error)."""
    return False


def gloo_built():
    """False: rackhub does not use Gloo (the hub is the controller)."""
    return False


def gloo_enabled():
    """False: rackhub does not use Gloo."""
    return False


def nccl_built():
    """False (Horovod returns the NCCL version, 0 = not built)."""
    return False


def ddl_built():
    return False


def ccl_built():
    return False


def cuda_built():
    """True if the torch in use was built with CUDA."""
    return torch.version.cuda is not None


def rocm_built():
    """True if the torch in use was built with ROCm."""
    return getattr(torch.version, "hip", None) is not None


def cross_rank():
    """This rank's index among the ranks with its local rank (its host's
    index when every host runs the same number of ranks)."""
    return _context.need().cross_rank


def cross_size():
    """The number of ranks with this rank's local rank (the number of hosts
    when every host runs the same number of ranks)."""
    return _context.need().cross_size


def is_homogeneous():
    """True if every host runs the same number of ranks."""
    return _context.need().homogeneous
