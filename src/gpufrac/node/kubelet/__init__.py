"""The kubelet's gRPC APIs, as the node agent speaks them: PodResources v1 (which devices each container
holds, and which the node has) and the device plugin API v1beta1 (serving an extended resource).

The agent reads the kubelet's answers rather than inferring device ownership from NVML, because the kubelet
is what decided it: a pod asking `nvidia.com/gpu` from NVIDIA's plugin holds the GPUs the kubelet lists,
and gpufrac must not place fractions on them. The messages are built from descriptors in Python
(protos.py), so the image needs grpcio and protobuf but no code generator and no generated files.
"""
