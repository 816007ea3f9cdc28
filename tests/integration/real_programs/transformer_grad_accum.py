"""A small Transformer language model trained with gradient accumulation, AdamW and a warm-up
schedule, in the style of the PyTorch "language modeling with nn.Transformer" tutorial and of
the accumulation loops found in most training repositories. Synthetic tokens.

    python transformer_grad_accum.py [--seconds S] [--accum N] [--mistake]

--mistake plants the classic error from PyTorch's FAQ: the running loss for the log line is
accumulated as a tensor (`running_loss += loss`) instead of a number (`loss.item()`), so the
autograd graph of every micro-batch since the start of the epoch stays alive.
"""

import argparse
import math
import time

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


class PositionalEncoding(nn.Module):
    def __init__(self, d_model, dropout=0.1, max_len=512):
        super().__init__()
        self.dropout = nn.Dropout(p=dropout)
        position = torch.arange(max_len).unsqueeze(1)
        div_term = torch.exp(torch.arange(0, d_model, 2) * (-math.log(10000.0) / d_model))
        pe = torch.zeros(max_len, 1, d_model)
        pe[:, 0, 0::2] = torch.sin(position * div_term)
        pe[:, 0, 1::2] = torch.cos(position * div_term)
        self.register_buffer("pe", pe)

    def forward(self, x):
        x = x + self.pe[: x.size(0)]
        return self.dropout(x)


class TransformerModel(nn.Module):
    def __init__(self, ntoken, d_model=64, nhead=4, d_hid=128, nlayers=2, dropout=0.1):
        super().__init__()
        self.model_type = "Transformer"
        self.pos_encoder = PositionalEncoding(d_model, dropout)
        encoder_layers = nn.TransformerEncoderLayer(d_model, nhead, d_hid, dropout)
        self.transformer_encoder = nn.TransformerEncoder(encoder_layers, nlayers,
                                                         enable_nested_tensor=False)
        self.embedding = nn.Embedding(ntoken, d_model)
        self.d_model = d_model
        self.linear = nn.Linear(d_model, ntoken)

    def forward(self, src, src_mask=None):
        src = self.embedding(src) * math.sqrt(self.d_model)
        src = self.pos_encoder(src)
        output = self.transformer_encoder(src, src_mask)
        return self.linear(output)


def make_loader(ntokens, seq_len=32, batch_size=8):
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, ntokens, (8192, seq_len + 1), generator=g)
    return DataLoader(TensorDataset(tokens[:, :-1], tokens[:, 1:]), batch_size=batch_size,
                      shuffle=True, drop_last=True)


def train_one_epoch(model, loader, optimizer, scheduler, epoch, args, deadline):
    model.train()
    criterion = nn.CrossEntropyLoss()
    running_loss = 0.0
    start = time.time()
    mask = nn.Transformer.generate_square_subsequent_mask(loader.dataset[0][0].size(0))
    optimizer.zero_grad(set_to_none=True)
    for i, (src, tgt) in enumerate(loader):
        src, tgt = src.t(), tgt.t()  # (seq, batch), as nn.Transformer expects
        output = model(src, mask)
        loss = criterion(output.view(-1, output.size(-1)), tgt.reshape(-1))
        loss = loss / args.accum
        loss.backward()
        if args.mistake:
            running_loss += loss
        else:
            running_loss += loss.item()
        if (i + 1) % args.accum == 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
        if (i + 1) % (args.accum * 5) == 0:
            elapsed = time.time() - start
            print(f"| epoch {epoch:3d} | {i + 1:5d}/{len(loader):5d} batches | "
                  f"lr {scheduler.get_last_lr()[0]:.2e} | ms/batch {elapsed * 1000 / (i + 1):6.2f} | "
                  f"loss {float(running_loss) * args.accum / (i + 1):5.2f}", flush=True)
        if time.time() > deadline:
            break


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--accum", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=600)
    parser.add_argument("--mistake", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    ntokens = 1000
    model = TransformerModel(ntokens)
    loader = make_loader(ntokens)
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-4, weight_decay=0.01)
    warmup = 50
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / warmup))
    deadline = time.time() + args.seconds
    epoch = 1
    while time.time() < deadline:
        train_one_epoch(model, loader, optimizer, scheduler, epoch, args, deadline)
        epoch += 1


if __name__ == "__main__":
    main()
