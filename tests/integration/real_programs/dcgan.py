"""DCGAN, written the way the PyTorch DCGAN tutorial writes it: module-level script, a
Generator and a Discriminator, two Adam optimizers, a DataLoader with worker processes, the
discriminator trained on real and on `fake.detach()`, losses kept for plotting. The images
are synthetic (blurred blobs made by the Dataset's __getitem__) so that it runs anywhere.

    python dcgan.py [--seconds S] [--workers N] [--mistake]

Every 20 iterations it logs, beside the losses, the seconds spent waiting for the DataLoader and
the seconds of all iterations since the last line (the ImageNet example's Data/Time meters): the
loader's share of the loop measured with no tool attached.

--mistake plants the classic error: the losses are appended as tensors (`G_losses.append(errG)`)
instead of numbers (`errG.item()`), so every iteration's graph stays alive in the lists.
"""

import argparse
import time

import torch
import torch.nn as nn
import torch.optim as optim
from torch.utils.data import DataLoader, Dataset

parser = argparse.ArgumentParser()
parser.add_argument("--workers", type=int, default=2)
parser.add_argument("--batch_size", type=int, default=32)
parser.add_argument("--seconds", type=float, default=600)
parser.add_argument("--mistake", action="store_true")
opt = parser.parse_args()

torch.manual_seed(999)
torch.set_num_threads(1)
device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")

nc, nz, ngf, ndf, image_size = 1, 16, 16, 16, 16
lr, beta1 = 0.0002, 0.5


class BlobImages(Dataset):
    """Gaussian blobs at random places, normalised to [-1, 1] like the tutorial's transforms."""

    def __len__(self):
        return 4096

    def __getitem__(self, index):
        g = torch.Generator().manual_seed(index)
        cy, cx = torch.randint(3, image_size - 3, (2,), generator=g).tolist()
        ys = torch.arange(image_size).view(-1, 1).float()
        xs = torch.arange(image_size).view(1, -1).float()
        img = torch.exp(-((ys - cy) ** 2 + (xs - cx) ** 2) / 8.0)
        for _ in range(3):  # a little smoothing, as an augmentation pipeline would cost
            img = torch.nn.functional.avg_pool2d(img[None, None], 3, 1, 1)[0, 0]
        return (img * 2 - 1).unsqueeze(0), 0


dataloader = DataLoader(BlobImages(), batch_size=opt.batch_size, shuffle=True,
                        num_workers=opt.workers)


def weights_init(m):
    classname = m.__class__.__name__
    if classname.find("Conv") != -1:
        nn.init.normal_(m.weight.data, 0.0, 0.02)
    elif classname.find("BatchNorm") != -1:
        nn.init.normal_(m.weight.data, 1.0, 0.02)
        nn.init.constant_(m.bias.data, 0)


class Generator(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(
            nn.ConvTranspose2d(nz, ngf * 2, 4, 1, 0, bias=False),
            nn.BatchNorm2d(ngf * 2),
            nn.ReLU(True),
            nn.ConvTranspose2d(ngf * 2, ngf, 4, 2, 1, bias=False),
            nn.BatchNorm2d(ngf),
            nn.ReLU(True),
            nn.ConvTranspose2d(ngf, nc, 4, 2, 1, bias=False),
            nn.Tanh(),
        )

    def forward(self, input):
        return self.main(input)


class Discriminator(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(
            nn.Conv2d(nc, ndf, 4, 2, 1, bias=False),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf, ndf * 2, 4, 2, 1, bias=False),
            nn.BatchNorm2d(ndf * 2),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf * 2, 1, 4, 1, 0, bias=False),
            nn.Sigmoid(),
        )

    def forward(self, input):
        return self.main(input)


netG = Generator().to(device)
netG.apply(weights_init)
netD = Discriminator().to(device)
netD.apply(weights_init)

criterion = nn.BCELoss()
fixed_noise = torch.randn(64, nz, 1, 1, device=device)
real_label, fake_label = 1., 0.
optimizerD = optim.Adam(netD.parameters(), lr=lr, betas=(beta1, 0.999))
optimizerG = optim.Adam(netG.parameters(), lr=lr, betas=(beta1, 0.999))

img_list = []
G_losses = []
D_losses = []
iters = 0

print("Starting Training Loop...", flush=True)
deadline = time.time() + opt.seconds
epoch = 0
data_time = batch_time = 0.0  # since the last log line, as the ImageNet example's meters
while time.time() < deadline:
    end = time.time()
    for i, data in enumerate(dataloader, 0):
        data_time += time.time() - end
        ############################
        # (1) Update D network: maximize log(D(x)) + log(1 - D(G(z)))
        ###########################
        netD.zero_grad()
        real_cpu = data[0].to(device)
        b_size = real_cpu.size(0)
        label = torch.full((b_size,), real_label, dtype=torch.float, device=device)
        output = netD(real_cpu).view(-1)
        errD_real = criterion(output, label)
        errD_real.backward()
        D_x = output.mean().item()

        noise = torch.randn(b_size, nz, 1, 1, device=device)
        fake = netG(noise)
        label.fill_(fake_label)
        output = netD(fake.detach()).view(-1)
        errD_fake = criterion(output, label)
        errD_fake.backward()
        D_G_z1 = output.mean().item()
        errD = errD_real + errD_fake
        optimizerD.step()

        ############################
        # (2) Update G network: maximize log(D(G(z)))
        ###########################
        netG.zero_grad()
        label.fill_(real_label)
        output = netD(fake).view(-1)
        errG = criterion(output, label)
        errG.backward()
        D_G_z2 = output.mean().item()
        optimizerG.step()

        batch_time += time.time() - end
        end = time.time()
        if i % 20 == 0:
            print("[%d][%d/%d]\tLoss_D: %.4f\tLoss_G: %.4f\tD(x): %.4f\tD(G(z)): %.4f / %.4f"
                  "\tData %.3f\tTime %.3f"
                  % (epoch, i, len(dataloader), errD.item(), errG.item(), D_x, D_G_z1, D_G_z2,
                     data_time, batch_time),
                  flush=True)
            data_time = batch_time = 0.0

        # Save Losses for plotting later
        if opt.mistake:
            G_losses.append(errG)
            D_losses.append(errD)
        else:
            G_losses.append(errG.item())
            D_losses.append(errD.item())

        if iters % 500 == 0:
            with torch.no_grad():
                fake = netG(fixed_noise).detach().cpu()
            img_list.append(fake)
        iters += 1
        if time.time() > deadline:
            break
    epoch += 1
