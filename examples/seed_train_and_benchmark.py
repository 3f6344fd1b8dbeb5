# train_and_benchmark.py
import torch
import kiln
import torch.nn as nn
import time

class TransformerBlock(nn.Module):
    def __init__(self, d_model=1024, nhead=16):
        super().__init__()
        self.attn = nn.MultiheadAttention(d_model, nhead, batch_first=True)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(
            nn.Linear(d_model, d_model * 4),
            nn.GELU(),
            nn.Linear(d_model * 4, d_model),
        )

    def forward(self, x):
        attn_out, _ = self.attn(x, x, x)
        x = self.norm1(x + attn_out)
        mlp_out = self.mlp(x)
        x = self.norm2(x + mlp_out)
        return x

# 1. 实例化模型并移动至 GPU
device = "cuda" if torch.cuda.is_available() else "cpu"
model = TransformerBlock().to(device)
dummy_input = torch.randn(32, 512, 1024, device=device) # Batch=32, SeqLen=512

# 2. 启用 PyTorch 2.x 极速编译
# mode="max-autotune" 会在初次预热时搜索最佳 Triton CUDA Kernel 配置
compiled_model = kiln.compile(model, mode="max-autotune")

# 3. 预热编译 (Warm-up: 首次执行触发 JIT 编译)
print("🔥 正在触发 TorchInductor 编译与 Triton 算子融合...")
for _ in range(5):
    _ = compiled_model(dummy_input)
torch.cuda.synchronize()

# 4. 性能基准压测对比
def benchmark(fn, name, iters=100):
    start = time.perf_counter()
    for _ in range(iters):
        _ = fn(dummy_input)
    torch.cuda.synchronize()
    avg_ms = (time.perf_counter() - start) * 1000 / iters
    print(f"[{name}] 平均单次推理耗时: {avg_ms:.2f} ms")

benchmark(model, "原生动态图 (Eager Mode)")
benchmark(compiled_model, "PyTorch 2.x 编译加速 (torch.compile)")
