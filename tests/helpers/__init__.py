"""What several test files share, one module per job: server processes and the CLI (processes),
in-process servers (servers), HTTP helpers for the service (service), health under load (health),
graphs and one-op graph builders (graphs), random graphs (random_graphs, plan_graphs) and their
PyTorch translation (torch_reference), the NumPy <-> torch conversion of the PyTorch oracle
(torch_oracle), reduced-precision cases, the CUDA emulator's runtime (emulated) and load-scaled
waiting (waiting).

tests/ is on sys.path (pytest puts the rootdir conftest's folder there), so a test imports
`from helpers.processes import server_process`; no test file imports another."""
