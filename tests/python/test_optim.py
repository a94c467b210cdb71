"""afterburner.optim against torch.optim: the same parameters after several steps over a model
with BatchNorm, channels_last and no-bias layers, several groups, schedulers, state_dicts
exchanged in both directions, and errors."""
import copy

import pytest
import torch
import torch.nn.functional as F

from afterburner.optim import FlatAdamW, FlatSGD


def make_model():
    # No bias before BatchNorm, as users write it: that bias's gradient is rounding noise around
    # 0, which AdamW normalises into steps of full size and random sign in any two runs.
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1, bias=False), torch.nn.BatchNorm2d(8), torch.nn.ReLU(), torch.nn.Flatten(),
        torch.nn.Linear(8 * 5 * 5, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def batches(count, size=7):
    generator = torch.Generator().manual_seed(1)
    return [(torch.randn(size, 3, 5, 5, generator=generator), torch.randint(0, 4, (size,), generator=generator))
            for _ in range(count)]


def groups(model, **second_group):
    """Two parameter groups: the convolution's weight (with its own options) and the rest."""
    conv = list(model[0].parameters())
    rest = [p for p in model.parameters() if all(p is not c for c in conv)]
    return [dict(params=conv, **second_group), dict(params=rest)]


def train(model, optimizer, data, scheduler=None):
    for x, y in data:
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
        if scheduler:
            scheduler.step()


def assert_same_parameters(a, b, exact=False):
    for (name, got), want in zip(a.named_parameters(), b.parameters()):
        if exact:
            assert torch.equal(got, want), name
        else:
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6, msg=name)


SGD_OPTIONS = [dict(lr=0.1), dict(lr=0.05, momentum=0.9), dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=5e-4),
               dict(lr=0.02, momentum=0.5, dampening=0.3, weight_decay=1e-3)]
ADAMW_OPTIONS = [dict(), dict(lr=3e-3, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1)]


@pytest.mark.parametrize("ours,theirs,options", [(FlatSGD, torch.optim.SGD, o) for o in SGD_OPTIONS] +
                         [(FlatAdamW, torch.optim.AdamW, o) for o in ADAMW_OPTIONS])
def test_steps_match_torch(ours, theirs, options):
    model = make_model()
    reference = copy.deepcopy(model)
    second = dict(lr=options.get("lr", 1e-3) * 0.5)
    optimizer, torch_optimizer = ours(groups(model, **second), **options), theirs(groups(reference, **second), **options)
    train(model, optimizer, batches(6))
    train(reference, torch_optimizer, batches(6))
    assert_same_parameters(model, reference)
    again = make_model()  # a second run gives the same bits
    train(again, ours(groups(again, **second), **options), batches(6))
    assert_same_parameters(model, again, exact=True)


@pytest.mark.parametrize("ours,theirs,options", [(FlatSGD, torch.optim.SGD, dict(lr=0.05, momentum=0.9)),
                                                 (FlatAdamW, torch.optim.AdamW, dict(lr=1e-3))])
def test_state_dicts_move_between_torch_and_afterburner(ours, theirs, options):
    data = batches(8)
    model = make_model()
    optimizer = ours(model.parameters(), **options)
    train(model, optimizer, data[:4])
    for first, second in ((ours, theirs), (theirs, ours)):  # ours -> torch, and torch -> ours
        source = make_model()
        source_optimizer = first(source.parameters(), **options)
        train(source, source_optimizer, data[:4])
        target = copy.deepcopy(source)
        target_optimizer = second(target.parameters(), **options)
        target_optimizer.load_state_dict(source_optimizer.state_dict())
        train(source, source_optimizer, data[4:])
        train(target, target_optimizer, data[4:])
        assert_same_parameters(target, source)


def test_schedulers_drive_it_and_channels_last_moves_mid_training():
    model, reference = make_model(), make_model()
    optimizer = FlatSGD(model.parameters(), lr=0.1, momentum=0.9)
    torch_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    schedulers = [torch.optim.lr_scheduler.StepLR(o, step_size=2, gamma=0.5) for o in (optimizer, torch_optimizer)]
    data = batches(6)
    train(model, optimizer, data[:3], schedulers[0])
    train(reference, torch_optimizer, data[:3], schedulers[1])
    for net in (model, reference):  # the parameters change layout under the optimizers
        net.to(memory_format=torch.channels_last)
    train(model, optimizer, [(x.to(memory_format=torch.channels_last), y) for x, y in data[3:]], schedulers[0])
    train(reference, torch_optimizer, [(x.to(memory_format=torch.channels_last), y) for x, y in data[3:]],
          schedulers[1])
    assert optimizer.param_groups[0]["lr"] == torch_optimizer.param_groups[0]["lr"] == 0.0125
    assert_same_parameters(model, reference)


def test_parameters_without_gradients_are_skipped_and_get_no_state():
    frozen, trained = torch.nn.Linear(3, 3), torch.nn.Linear(3, 3)
    optimizer = FlatSGD(list(frozen.parameters()) + list(trained.parameters()), lr=0.1, momentum=0.9)
    before = frozen.weight.detach().clone()
    trained(torch.randn(2, 3)).sum().backward()
    optimizer.step()
    assert torch.equal(frozen.weight, before) and frozen.weight not in optimizer.state
    assert "momentum_buffer" in optimizer.state[trained.weight]


def test_bad_input_is_one_clear_error():
    with pytest.raises(RuntimeError, match=r"sgd_step params\[0\]: expected a dense float32 CPU tensor"):
        layer = torch.nn.Linear(2, 2).double()
        layer(torch.randn(1, 2, dtype=torch.double)).sum().backward()
        FlatSGD(layer.parameters(), lr=0.1).step()
    with pytest.raises(ValueError, match="amsgrad=True is not supported"):
        FlatAdamW(torch.nn.Linear(2, 2).parameters(), amsgrad=True)
    with pytest.raises(ValueError, match="Nesterov"):
        FlatSGD(torch.nn.Linear(2, 2).parameters(), lr=0.1, nesterov=True)
