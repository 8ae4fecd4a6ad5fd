# Loads a LoRA adapter written by `zeropipe convert` into transformers + PEFT on its base (a hub
# folder), and checks that every tensor of the file is what PEFT holds after loading, and that the
# model runs. Usage: peft_load_check.py HUB_DIR ADAPTER_DIR
import sys, torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM
from peft import PeftModel
hub, adapter = sys.argv[1:3]
model = AutoModelForCausalLM.from_pretrained(hub, dtype=torch.bfloat16, device_map="cuda")
peft_model = PeftModel.from_pretrained(model, adapter)
state = peft_model.state_dict()
f = safe_open(adapter + "/adapter_model.safetensors", "pt")
keys, differ, missing = list(f.keys()), 0, 0
for k in keys:
    k2 = k.replace(".lora_A.weight", ".lora_A.default.weight").replace(".lora_B.weight", ".lora_B.default.weight")
    if k2 not in state:
        missing += 1
        continue
    differ += not torch.equal(state[k2].cpu(), f.get_tensor(k).to(state[k2].dtype))
lora_layers = sum(1 for _, m in peft_model.named_modules()
                  if hasattr(m, "lora_A") and "default" in getattr(m, "lora_A", {}))
nonzero_b = sum(1 for k in keys if "lora_B" in k and f.get_tensor(k).abs().max() > 0)
out = peft_model(torch.tensor([[128000, 791, 1917, 374]], device="cuda")).logits
print(f"PEFT: {len(keys)} adapter tensors, {missing} not found in the PEFT model, {differ} differ after loading; "
      f"{lora_layers} LoRA layers; {nonzero_b} lora_B trained away from zero; "
      f"logits finite: {bool(torch.isfinite(out).all())}")
