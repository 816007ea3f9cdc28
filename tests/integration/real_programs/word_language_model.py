"""Word-level LSTM language model, written the way pytorch/examples' word_language_model is:
batchify a token stream, truncated BPTT with `repackage_hidden`, gradient clipping and a manual
SGD update on `p.data`. The corpus is synthetic (Zipf-distributed token ids) so that it runs
anywhere.

    python word_language_model.py [--seconds S] [--mistake]

--mistake plants the classic error: the hidden state is carried from batch to batch without
being detached, and `backward(retain_graph=True)` silences the error that follows, so every
batch's graph stays chained to all the batches before it.
"""

import argparse
import math
import time

import torch
import torch.nn as nn

parser = argparse.ArgumentParser(description="PyTorch LSTM language model (synthetic corpus)")
parser.add_argument("--emsize", type=int, default=64)
parser.add_argument("--nhid", type=int, default=64)
parser.add_argument("--nlayers", type=int, default=2)
parser.add_argument("--lr", type=float, default=20)
parser.add_argument("--clip", type=float, default=0.25)
parser.add_argument("--bptt", type=int, default=20)
parser.add_argument("--batch_size", type=int, default=16)
parser.add_argument("--log-interval", type=int, default=10)
parser.add_argument("--seconds", type=float, default=600)
parser.add_argument("--mistake", action="store_true")
args = parser.parse_args()

torch.manual_seed(1111)
torch.set_num_threads(1)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

ntokens = 2000
weights = 1.0 / torch.arange(1, ntokens + 1, dtype=torch.float)
train_stream = torch.multinomial(weights, 50_000, replacement=True)


def batchify(data, bsz):
    nbatch = data.size(0) // bsz
    data = data.narrow(0, 0, nbatch * bsz)
    return data.view(bsz, -1).t().contiguous().to(device)


train_data = batchify(train_stream, args.batch_size)


class RNNModel(nn.Module):
    """Container module with an encoder, a recurrent module, and a decoder."""

    def __init__(self, ntoken, ninp, nhid, nlayers, dropout=0.2):
        super().__init__()
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = nn.LSTM(ninp, nhid, nlayers, dropout=dropout)
        self.decoder = nn.Linear(nhid, ntoken)
        self.nhid = nhid
        self.nlayers = nlayers

    def forward(self, input, hidden):
        emb = self.drop(self.encoder(input))
        output, hidden = self.rnn(emb, hidden)
        output = self.drop(output)
        decoded = self.decoder(output).view(-1, self.decoder.out_features)
        return nn.functional.log_softmax(decoded, dim=1), hidden

    def init_hidden(self, bsz):
        weight = next(self.parameters())
        return (weight.new_zeros(self.nlayers, bsz, self.nhid),
                weight.new_zeros(self.nlayers, bsz, self.nhid))


def repackage_hidden(h):
    """Wraps hidden states in new Tensors, to detach them from their history."""
    if isinstance(h, torch.Tensor):
        return h.detach()
    return tuple(repackage_hidden(v) for v in h)


def get_batch(source, i):
    seq_len = min(args.bptt, len(source) - 1 - i)
    data = source[i:i + seq_len]
    target = source[i + 1:i + 1 + seq_len].reshape(-1)
    return data, target


model = RNNModel(ntokens, args.emsize, args.nhid, args.nlayers).to(device)
criterion = nn.NLLLoss()


def train(epoch, deadline):
    model.train()
    total_loss = 0.
    start_time = time.time()
    hidden = model.init_hidden(args.batch_size)
    for batch, i in enumerate(range(0, train_data.size(0) - 1, args.bptt)):
        data, targets = get_batch(train_data, i)
        if not args.mistake:
            # Starting each batch, we detach the hidden state from how it was previously produced.
            hidden = repackage_hidden(hidden)
        model.zero_grad()
        output, hidden = model(data, hidden)
        loss = criterion(output, targets)
        loss.backward(retain_graph=args.mistake)

        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-args.lr)

        total_loss += loss.item()
        if batch % args.log_interval == 0 and batch > 0:
            cur_loss = total_loss / args.log_interval
            elapsed = time.time() - start_time
            print("| epoch {:3d} | {:5d}/{:5d} batches | lr {:02.2f} | ms/batch {:5.2f} | "
                  "loss {:5.2f} | ppl {:8.2f}".format(
                      epoch, batch, len(train_data) // args.bptt, args.lr,
                      elapsed * 1000 / args.log_interval, cur_loss, math.exp(min(cur_loss, 50))),
                  flush=True)
            total_loss = 0
            start_time = time.time()
        if time.time() > deadline:
            return


def main():
    deadline = time.time() + args.seconds
    epoch = 1
    while time.time() < deadline:
        epoch_start_time = time.time()
        train(epoch, deadline)
        print("-" * 89)
        print(f"| end of epoch {epoch:3d} | time: {time.time() - epoch_start_time:5.2f}s")
        print("-" * 89, flush=True)
        epoch += 1


if __name__ == "__main__":
    main()
