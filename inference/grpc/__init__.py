"""The Open Inference Protocol over gRPC (``inference.GRPCInferenceService``), beside the /v2 REST endpoints.

``grpc_service.proto`` declares the service; ``grpc_service_pb2*`` are generated from it by
``scripts/generate_grpc.py``; ``codec.py`` turns its messages into the data plane's requests and
back; ``server.py`` serves it with ``grpc.aio`` on the event loop that serves /v2.
"""
