"""The workload side: the client API a training script calls, fault injection, ranks."""
