"""An image classifier trained with automatic mixed precision, in the style of pytorch/examples'
imagenet script and the AMP recipe: AverageMeters for batch and data time, a DataLoader with
worker processes, `torch.autocast` + `GradScaler`, a cosine schedule. Synthetic images (the
Dataset augments them on the fly), sized for a CPU; mixed precision (fp16) is on where CUDA is,
the recipe's `enabled=use_amp` switch, so the same loop runs in fp32 on a CPU.

    python amp_classifier.py [--seconds S] [--workers N] [--mistake]

--mistake plants the classic error: `optimizer.zero_grad()` was lost in a refactor, so every
step adds its gradients onto all the previous ones.
"""

import argparse
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset


class AverageMeter:
    """Computes and stores the average and current value"""

    def __init__(self, name, fmt=":f"):
        self.name, self.fmt = name, fmt
        self.reset()

    def reset(self):
        self.val = self.avg = self.sum = 0
        self.count = 0

    def update(self, val, n=1):
        self.val = val
        self.sum += val * n
        self.count += n
        self.avg = self.sum / self.count

    def __str__(self):
        fmtstr = "{name} {val" + self.fmt + "} ({avg" + self.fmt + "})"
        return fmtstr.format(**self.__dict__)


class SyntheticImages(Dataset):
    def __init__(self, n=20000, num_classes=10):
        self.n, self.num_classes = n, num_classes

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        label = i % self.num_classes
        img = torch.rand(3, 40, 40, generator=g) * 0.5
        img[label % 3, 4 * label:4 * label + 8, :] += 0.5   # a class-dependent stripe
        top, left = torch.randint(0, 9, (2,), generator=g).tolist()
        img = img[:, top:top + 32, left:left + 32]        # RandomCrop(32)
        if torch.rand(1, generator=g).item() < 0.5:
            img = img.flip(2)                              # RandomHorizontalFlip
        mean = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
        std = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)
        return (img - mean) / std, label


class Net(nn.Module):
    def __init__(self, num_classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(32)
        self.fc1 = nn.Linear(32 * 8 * 8, 128)
        self.fc2 = nn.Linear(128, num_classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        x = torch.flatten(x, 1)
        return self.fc2(F.relu(self.fc1(x)))


def train(loader, model, criterion, optimizer, scheduler, scaler, epoch, device, args, deadline):
    batch_time = AverageMeter("Time", ":6.3f")
    data_time = AverageMeter("Data", ":6.3f")
    losses = AverageMeter("Loss", ":.4e")
    model.train()
    use_amp = device.type == "cuda"  # CPU autocast (bfloat16) is slower than fp32 for convs
    end = time.time()
    for i, (images, target) in enumerate(loader):
        data_time.update(time.time() - end)
        images = images.to(device, non_blocking=True)
        target = target.to(device, non_blocking=True)

        with torch.autocast(device_type=device.type, dtype=torch.float16, enabled=use_amp):
            output = model(images)
            loss = criterion(output, target)

        if not args.mistake:
            optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        scheduler.step()

        losses.update(loss.item(), images.size(0))
        batch_time.update(time.time() - end)
        end = time.time()
        if i % 20 == 0:
            print(f"Epoch: [{epoch}][{i:4d}/{len(loader)}]\t{batch_time}\t{data_time}\t{losses}",
                  flush=True)
        if time.time() > deadline:
            break


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=600)
    parser.add_argument("--mistake", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = Net().to(device)
    criterion = nn.CrossEntropyLoss().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=10_000)
    scaler = torch.amp.GradScaler(device.type, enabled=device.type == "cuda")
    loader = DataLoader(SyntheticImages(), batch_size=args.batch_size, shuffle=True,
                        num_workers=args.workers, pin_memory=device.type == "cuda",
                        persistent_workers=args.workers > 0)
    deadline = time.time() + args.seconds
    epoch = 0
    while time.time() < deadline:
        train(loader, model, criterion, optimizer, scheduler, scaler, epoch, device, args, deadline)
        epoch += 1


if __name__ == "__main__":
    main()
