"""PyTorch, padded with masks: python torch_padded.py DUMP [--steps K] [--threads T]"""
import common
import models

a = common.args()
torch = common.setup_torch(a.threads)
man, arrays = common.load(a.dump)
case = man["case"]
p = models.params(torch, arrays)
m = models.Padded(torch, man, arrays)


def step():
    if a.fwd:
        with torch.no_grad():
            return float(m.loss(case, p))
    loss = m.loss(case, p)
    loss.backward()
    models.sgd(torch, p, models.LR[case])
    return float(loss)


common.report("torch-padded", man, a, common.measure(step, a.steps))
