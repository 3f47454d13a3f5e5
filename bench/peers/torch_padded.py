"""PyTorch, padded with masks: python torch_padded.py DUMP [--steps K] [--threads T] [--only ...]"""
import common
import models

a = common.args()
torch = common.setup_torch(a.threads)
man, arrays = common.load(a.dump)
case = man["case"]
p = models.params(torch, arrays)
m = models.Padded(torch, man, arrays)

common.bench("torch-padded", man, a, torch, lambda p: m.loss(case, p), p, models.LR[case])
