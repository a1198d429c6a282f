"""A plain torch training job: an MLP, AdamW, and a finite-loss check that reads the loss."""

import torch


def check_finite(loss: torch.Tensor) -> float:
    value = loss.item()
    if value != value:
        raise RuntimeError("the loss is NaN")
    return value


def main() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(2048, 8192), torch.nn.GELU(), torch.nn.Linear(8192, 2048)
    ).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(4096, 2048, device="cuda")
    y = torch.randn(4096, 2048, device="cuda")
    for _ in range(40):
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        check_finite(loss)


if __name__ == "__main__":
    main()
