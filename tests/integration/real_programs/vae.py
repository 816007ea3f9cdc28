"""A variational autoencoder trained the way pytorch/examples/vae/main.py trains it, on
synthetic 28x28 "images" (no download; MNIST's 60000 per epoch): a DataLoader with workers, a
module-level model and Adam, a train(epoch) function that sums the epoch's loss for its log line.
Each log line also says the seconds spent waiting for the DataLoader and the seconds of all
iterations since the last line (the ImageNet example's Data/Time meters).

--mistake: `train_loss += loss` instead of `loss.item()` (the PyTorch FAQ's first memory
question): the running sum keeps every step's autograd graph chained until the epoch ends.
"""
import argparse
import time

import torch
import torch.utils.data
from torch import nn, optim
from torch.nn import functional as F

parser = argparse.ArgumentParser(description='VAE Example')
parser.add_argument('--batch-size', type=int, default=128, metavar='N',
                    help='input batch size for training (default: 128)')
parser.add_argument('--epochs', type=int, default=10000, metavar='N',
                    help='number of epochs to train (default: 10000)')
parser.add_argument('--log-interval', type=int, default=10, metavar='N',
                    help='how many batches to wait before logging training status')
parser.add_argument('--seconds', type=float, default=600.0, help='stop after this long')
parser.add_argument('--mistake', action='store_true', help='sum the loss tensors, not numbers')
args = parser.parse_args()

torch.manual_seed(1)
device = torch.device("cpu")
deadline = time.monotonic() + args.seconds


class Blobs(torch.utils.data.Dataset):
    """60000 random images in [0, 1], each the same at every epoch."""

    def __len__(self):
        return 60000

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return torch.rand(1, 28, 28, generator=g), i % 10


kwargs = {'num_workers': 2, 'persistent_workers': True}
train_loader = torch.utils.data.DataLoader(Blobs(), batch_size=args.batch_size, shuffle=True, **kwargs)


class VAE(nn.Module):
    def __init__(self):
        super().__init__()

        self.fc1 = nn.Linear(784, 400)
        self.fc21 = nn.Linear(400, 20)
        self.fc22 = nn.Linear(400, 20)
        self.fc3 = nn.Linear(20, 400)
        self.fc4 = nn.Linear(400, 784)

    def encode(self, x):
        h1 = F.relu(self.fc1(x))
        return self.fc21(h1), self.fc22(h1)

    def reparameterize(self, mu, logvar):
        std = torch.exp(0.5 * logvar)
        eps = torch.randn_like(std)
        return mu + eps * std

    def decode(self, z):
        h3 = F.relu(self.fc3(z))
        return torch.sigmoid(self.fc4(h3))

    def forward(self, x):
        mu, logvar = self.encode(x.view(-1, 784))
        z = self.reparameterize(mu, logvar)
        return self.decode(z), mu, logvar


model = VAE().to(device)
optimizer = optim.Adam(model.parameters(), lr=1e-3)


# Reconstruction + KL divergence losses summed over all elements and batch
def loss_function(recon_x, x, mu, logvar):
    BCE = F.binary_cross_entropy(recon_x, x.view(-1, 784), reduction='sum')
    KLD = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
    return BCE + KLD


def train(epoch):
    model.train()
    train_loss = 0
    data_time = batch_time = 0.0  # since the last log line
    end = time.time()
    for batch_idx, (data, _) in enumerate(train_loader):
        data_time += time.time() - end
        data = data.to(device)
        optimizer.zero_grad()
        recon_batch, mu, logvar = model(data)
        loss = loss_function(recon_batch, data, mu, logvar)
        loss.backward()
        if args.mistake:
            train_loss += loss
        else:
            train_loss += loss.item()
        optimizer.step()
        batch_time += time.time() - end
        end = time.time()
        if batch_idx % args.log_interval == 0:
            print('Train Epoch: {} [{}/{} ({:.0f}%)]\tLoss: {:.6f}\tData {:.3f}\tTime {:.3f}'.format(
                epoch, batch_idx * len(data), len(train_loader.dataset),
                100. * batch_idx / len(train_loader),
                loss.item() / len(data), data_time, batch_time), flush=True)
            data_time = batch_time = 0.0
        if time.monotonic() > deadline:
            return False
    print('====> Epoch: {} Average loss: {:.4f}'.format(
          epoch, float(train_loss) / len(train_loader.dataset)), flush=True)
    return True


if __name__ == "__main__":
    for epoch in range(1, args.epochs + 1):
        if not train(epoch):
            break
