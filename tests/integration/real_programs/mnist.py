"""MNIST, written the way pytorch/examples/mnist/main.py writes it: Net (two convs, dropout, two
linears), train(args, model, device, train_loader, optimizer, epoch) and test() functions,
Adadelta with a StepLR, and DataLoader kwargs that add workers only on CUDA, so on a CPU the
loader runs in the training process (num_workers=0). No download here: the dataset is 60,000
synthetic 28x28 digits (a stroke pattern per class, noise), read as uint8 arrays the way
torchvision's MNIST reads its images, then ToTensor and Normalize.

--mistake: random rotation and elastic-style jitter are added to the training transform, as
users add augmentation, with the example's num_workers=0 unchanged: every batch's
augmentation now runs in the training loop's own process, between steps.
"""
import argparse
import math
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.optim.lr_scheduler import StepLR
from torch.utils.data import DataLoader, Dataset


class Net(nn.Module):
    def __init__(self):
        super(Net, self).__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = self.conv1(x)
        x = F.relu(x)
        x = self.conv2(x)
        x = F.relu(x)
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        x = self.fc1(x)
        x = F.relu(x)
        x = self.dropout2(x)
        x = self.fc2(x)
        output = F.log_softmax(x, dim=1)
        return output


class ToTensor:
    def __call__(self, pic):
        return torch.from_numpy(pic).float().div(255).unsqueeze(0)


class Normalize:
    def __init__(self, mean, std):
        self.mean, self.std = mean, std

    def __call__(self, tensor):
        return (tensor - self.mean) / self.std


class RandomRotation:
    """Rotate by a random angle in [-degrees, degrees] (bilinear), as transforms.RandomRotation."""

    def __init__(self, degrees):
        self.degrees = degrees

    def __call__(self, pic):
        angle = math.radians(np.random.uniform(-self.degrees, self.degrees))
        c, s = math.cos(angle), math.sin(angle)
        h, w = pic.shape
        yy, xx = np.mgrid[0:h, 0:w].astype(np.float64)
        yc, xc = yy - (h - 1) / 2, xx - (w - 1) / 2
        src_x = c * xc + s * yc + (w - 1) / 2
        src_y = -s * xc + c * yc + (h - 1) / 2
        x0, y0 = np.floor(src_x).astype(int), np.floor(src_y).astype(int)
        fx, fy = src_x - x0, src_y - y0
        out = np.zeros((h, w))
        img = pic.astype(np.float64)
        for dy, dx, wgt in ((0, 0, (1 - fy) * (1 - fx)), (0, 1, (1 - fy) * fx),
                            (1, 0, fy * (1 - fx)), (1, 1, fy * fx)):
            yi, xi = y0 + dy, x0 + dx
            ok = (yi >= 0) & (yi < h) & (xi >= 0) & (xi < w)
            out[ok] += wgt[ok] * img[yi[ok], xi[ok]]
        return out.clip(0, 255).astype(np.uint8)


class ElasticJitter:
    """Small random displacements smoothed over the image (a cheap elastic transform)."""

    def __init__(self, alpha=2.0, passes=6):
        self.alpha, self.passes = alpha, passes

    def __call__(self, pic):
        h, w = pic.shape
        dx, dy = np.random.uniform(-1, 1, (2, h, w))
        for _ in range(self.passes):  # a box blur, a few times over
            dx = (dx + np.roll(dx, 1, 0) + np.roll(dx, -1, 0) + np.roll(dx, 1, 1) + np.roll(dx, -1, 1)) / 5
            dy = (dy + np.roll(dy, 1, 0) + np.roll(dy, -1, 0) + np.roll(dy, 1, 1) + np.roll(dy, -1, 1)) / 5
        yy, xx = np.mgrid[0:h, 0:w]
        sy = np.clip(np.rint(yy + self.alpha * dy), 0, h - 1).astype(int)
        sx = np.clip(np.rint(xx + self.alpha * dx), 0, w - 1).astype(int)
        return pic[sy, sx]


class Compose:
    def __init__(self, transforms):
        self.transforms = transforms

    def __call__(self, x):
        for t in self.transforms:
            x = t(x)
        return x


class SyntheticMNIST(Dataset):
    """60,000 (train) or 10,000 (test) 28x28 uint8 digits: a class's stroke pattern plus noise."""

    def __init__(self, train=True, transform=None):
        rng = np.random.default_rng(0 if train else 1)
        n = 60000 if train else 10000
        self.targets = rng.integers(0, 10, n)
        yy, xx = np.mgrid[0:28, 0:28]
        patterns = []
        for k in range(10):
            angle = k * math.pi / 10
            stroke = np.abs((xx - 14) * math.cos(angle) + (yy - 14) * math.sin(angle)) < 2 + k % 3
            patterns.append(stroke * 200.0)
        noise = rng.integers(0, 56, (n, 28, 28))
        self.data = (np.stack(patterns)[self.targets] + noise).clip(0, 255).astype(np.uint8)
        self.transform = transform

    def __getitem__(self, index):
        img, target = self.data[index], int(self.targets[index])
        if self.transform is not None:
            img = self.transform(img)
        return img, target

    def __len__(self):
        return len(self.data)


def train(args, model, device, train_loader, optimizer, epoch, deadline):
    model.train()
    end = time.time()
    data_time = batch_time = 0.0
    for batch_idx, (data, target) in enumerate(train_loader):
        data_time += time.time() - end
        data, target = data.to(device), target.to(device)
        optimizer.zero_grad()
        output = model(data)
        loss = F.nll_loss(output, target)
        loss.backward()
        optimizer.step()
        batch_time += time.time() - end
        end = time.time()
        if batch_idx % args.log_interval == 0:
            print('Train Epoch: {} [{}/{} ({:.0f}%)]\tLoss: {:.6f}\tData {:.1f}%'.format(
                epoch, batch_idx * len(data), len(train_loader.dataset),
                100. * batch_idx / len(train_loader), loss.item(),
                100. * data_time / max(batch_time, 1e-9)), flush=True)
            data_time = batch_time = 0.0
            if args.dry_run:
                break
        if time.time() > deadline:
            return


def test(model, device, test_loader):
    model.eval()
    test_loss = 0
    correct = 0
    with torch.no_grad():
        for data, target in test_loader:
            data, target = data.to(device), target.to(device)
            output = model(data)
            test_loss += F.nll_loss(output, target, reduction='sum').item()  # sum up batch loss
            pred = output.argmax(dim=1, keepdim=True)  # get the index of the max log-probability
            correct += pred.eq(target.view_as(pred)).sum().item()

    test_loss /= len(test_loader.dataset)

    print('\nTest set: Average loss: {:.4f}, Accuracy: {}/{} ({:.0f}%)\n'.format(
        test_loss, correct, len(test_loader.dataset),
        100. * correct / len(test_loader.dataset)), flush=True)


def main():
    # Training settings
    parser = argparse.ArgumentParser(description='PyTorch MNIST Example')
    parser.add_argument('--batch-size', type=int, default=64, metavar='N',
                        help='input batch size for training (default: 64)')
    parser.add_argument('--test-batch-size', type=int, default=1000, metavar='N',
                        help='input batch size for testing (default: 1000)')
    parser.add_argument('--epochs', type=int, default=14, metavar='N',
                        help='number of epochs to train (default: 14)')
    parser.add_argument('--lr', type=float, default=1.0, metavar='LR',
                        help='learning rate (default: 1.0)')
    parser.add_argument('--gamma', type=float, default=0.7, metavar='M',
                        help='Learning rate step gamma (default: 0.7)')
    parser.add_argument('--no-cuda', action='store_true', default=False,
                        help='disables CUDA training')
    parser.add_argument('--dry-run', action='store_true', default=False,
                        help='quickly check a single pass')
    parser.add_argument('--seed', type=int, default=1, metavar='S',
                        help='random seed (default: 1)')
    parser.add_argument('--log-interval', type=int, default=10, metavar='N',
                        help='how many batches to wait before logging training status')
    parser.add_argument('--seconds', type=float, default=600.0, help='stop after this long')
    parser.add_argument('--mistake', action='store_true', help='augmentation in the main process')
    args = parser.parse_args()
    use_cuda = not args.no_cuda and torch.cuda.is_available()

    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    torch.set_num_threads(1)

    device = torch.device("cuda" if use_cuda else "cpu")

    train_kwargs = {'batch_size': args.batch_size, 'shuffle': True}
    test_kwargs = {'batch_size': args.test_batch_size}
    if use_cuda:
        cuda_kwargs = {'num_workers': 1,
                       'pin_memory': True}
        train_kwargs.update(cuda_kwargs)
        test_kwargs.update(cuda_kwargs)

    transform = Compose([ToTensor(), Normalize(0.1307, 0.3081)])
    if args.mistake:
        train_transform = Compose([RandomRotation(15), ElasticJitter(), ToTensor(), Normalize(0.1307, 0.3081)])
    else:
        train_transform = transform
    dataset1 = SyntheticMNIST(train=True, transform=train_transform)
    dataset2 = SyntheticMNIST(train=False, transform=transform)
    train_loader = DataLoader(dataset1, **train_kwargs)
    test_loader = DataLoader(dataset2, **test_kwargs)

    model = Net().to(device)
    optimizer = optim.Adadelta(model.parameters(), lr=args.lr)

    scheduler = StepLR(optimizer, step_size=1, gamma=args.gamma)
    deadline = time.time() + args.seconds
    for epoch in range(1, args.epochs + 1):
        train(args, model, device, train_loader, optimizer, epoch, deadline)
        if time.time() > deadline:
            break
        test(model, device, test_loader)
        scheduler.step()


if __name__ == '__main__':
    main()
