//! Test support: a kubelet stand-in (device manager, checkpoint, podresources v1)
