"""gpuledger certificates: CA and serving certificate generation and rotation."""
